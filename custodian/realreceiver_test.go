package custodian

import (
	"testing"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// grantUID and grantGID are what the real receivers grant (realrecv's
// fresh ids for this test process), set by TestMain.
var grantUID, grantGID uint32

// realReceiver is a tether-receiver process (custodian/internal/realrecv).
type realReceiver struct {
	*realrecv.Receiver
	sock  string
	tuple realrecvTuple
}

type realrecvTuple = admission.Tuple

func startReceiver(t testing.TB) *realReceiver {
	t.Helper()
	r := realrecv.Start(t)
	return &realReceiver{Receiver: r, sock: r.Sock, tuple: r.Tuple}
}

// dialer dials the receiver as the custodian does.
func (rr *realReceiver) dialer() Dialer {
	return StreamDialer(transport.Unix{Path: rr.sock, HostOnly: true}.Dial, wireclient.ClientConfig{})
}

func (rr *realReceiver) file(rel string) string { return rr.File(rel) }

func must(t testing.TB, err error) { t.Helper(); realrecv.Must(t, err) }
