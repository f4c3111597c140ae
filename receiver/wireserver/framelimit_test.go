package wireserver

import (
	"errors"
	"io"
	"testing"

	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

func TestFrameLimitNeverAboveProtocolMax(t *testing.T) {
	for _, n := range []int{-1, wire.MaxFrameSize + 1, 1 << 30} {
		if _, err := wire.FrameLimit(n); !errors.Is(err, wire.ErrLimit) {
			t.Errorf("FrameLimit(%d) err = %v, want ErrLimit", n, err)
		}
		if _, err := wireclient.NewClient(nopConn{}, wireclient.ClientConfig{MaxFrame: n}); !errors.Is(err, wire.ErrLimit) {
			t.Errorf("NewClient(MaxFrame %d) err = %v, want ErrLimit", n, err)
		}
		if _, err := NewServer(HandlerFunc(nil), ServerConfig{MaxFrame: n}); !errors.Is(err, wire.ErrLimit) {
			t.Errorf("NewServer(MaxFrame %d) err = %v, want ErrLimit", n, err)
		}
	}
	if got, _ := wire.FrameLimit(0); got != wire.MaxFrameSize {
		t.Errorf("FrameLimit(0) = %d", got)
	}
	if got, _ := wire.FrameLimit(4096); got != 4096 {
		t.Errorf("FrameLimit(4096) = %d", got)
	}
}

type nopConn struct{}

func (nopConn) Read([]byte) (int, error)    { return 0, io.EOF }
func (nopConn) Write(b []byte) (int, error) { return len(b), nil }
func (nopConn) Close() error                { return nil }
