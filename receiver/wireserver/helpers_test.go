package wireserver

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/internal/socktest"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

const (
	testDigest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testOpKey  = "op-1"
)

// pair starts a Server with h on one end and a Client on the other. Both
// are closed at cleanup.
func pair(t *testing.T, h Handler, scfg ServerConfig) (*wireclient.Client, *Server) {
	t.Helper()
	cc, sc := socktest.Pair(t)
	srv, err := NewServer(h, scfg)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(context.Background(), sc) }()
	cl, err := wireclient.NewClient(cc, wireclient.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.Close()
		srv.Close()
		<-served
	})
	return cl, srv
}

// rawPeer drives the server side of a connection by hand, frame by frame.
type rawPeer struct {
	t    *testing.T
	conn net.Conn
	fr   *wire.FrameReader
}

func newRawPeer(t *testing.T, conn net.Conn) *rawPeer {
	fr, err := wire.NewFrameReader(conn, 0)
	if err != nil {
		t.Fatal(err)
	}
	return &rawPeer{t: t, conn: conn, fr: fr}
}

func (p *rawPeer) send(v any) {
	p.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	p.sendRaw(b)
}

func (p *rawPeer) sendRaw(payload []byte) {
	p.t.Helper()
	if err := wire.WriteFrame(p.conn, payload, 0); err != nil {
		p.t.Fatal(err)
	}
}

// next reads one frame and decodes it into v (with the plain decoder: the
// peer checks what arrived, not how strictly).
func (p *rawPeer) next(v any) {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := p.fr.ReadFrame()
	if err != nil {
		p.t.Fatalf("read frame: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		p.t.Fatalf("decode %q: %v", b, err)
	}
}

// expectEOF asserts the other side closed the connection.
func (p *rawPeer) expectEOF() {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := p.fr.ReadFrame()
	if !errors.Is(err, io.EOF) {
		p.t.Fatalf("want the connection closed (EOF), got frame %q err %v", b, err)
	}
}

func codeOf(err error) errcode.Code {
	var e *errcode.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func soon() time.Time { return time.Now().Add(10 * time.Second) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type ioRWC = io.ReadWriteCloser

func hdr(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
