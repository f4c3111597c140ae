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
	port, err := pid1.OpenPort(w.Port, os.O_RDWR, portWait)
	if err != nil {
		return nil, err
	}
	link := muxlink.Guest(port)
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
