package vmguest

import (
	"context"
	"net"
	"os"
	"time"

	"github.com/tetherdev/tether/computer/vm/muxlink"
	"github.com/tetherdev/tether/computer/vm/pid1"
)

// dialWait bounds one connection to the receiver's loopback listener.
const dialWait = 5 * time.Second

// startWire opens the wire port and serves, for the life of the guest,
// each stream the host opens over it as one connection to w.Target. It
// returns the link (nil without w), over which the egress listener
// dials (egress_linux.go).
func startWire(w *Wire, log *logSink) (*muxlink.Link, error) {
	if w == nil {
		return nil, nil
	}
	link, err := openLink(w)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			s, err := link.Accept(context.Background())
			if err != nil {
				log.note("wire: %v", err)
				return
			}
			go bridge(s, w.Target, log)
		}
	}()
	return link, nil
}

// openLink starts the guest's end of the link: over the wire port, or
// over one vsock connection to the host (vsock_linux.go).
func openLink(w *Wire) (*muxlink.Link, error) {
	if w.VsockPort != 0 {
		c, err := dialHost(w.VsockPort, portWait)
		if err != nil {
			return nil, err
		}
		return muxlink.GuestConn(c), nil
	}
	port, err := pid1.OpenPort(w.Port, os.O_RDWR, portWait)
	if err != nil {
		return nil, err
	}
	return muxlink.Guest(port), nil
}

// bridge joins one stream to a new connection to the receiver.
func bridge(s *muxlink.Stream, target string, log *logSink) {
	c, err := net.DialTimeout("tcp", target, dialWait)
	if err != nil {
		log.note("wire: dial the receiver: %v", err)
		s.Close()
		return
	}
	muxlink.Join(s, c)
}
