package vm

import (
	"errors"
	"net"
	"os"
	"sync"

	"github.com/tetherdev/tether/computer/vm/muxlink"
)

// relay serves DIR/wire.sock: each connection is one stream of the link.
// It authenticates nobody: the custodian and the receiver run mutual TLS
// through it, and the socket's peer check on the custodian's side pins
// the relay's uid (root).
type relay struct {
	ln   net.Listener
	wg   sync.WaitGroup
	once sync.Once
}

// listenRelay listens on path, root's and the custodian's group's
// (0660): only the custodian's certificate gets past the receiver's TLS,
// and only root and that group may even connect, so no other local user
// can take the receiver's connection slots (every stream reaches it from
// the guest's loopback, one peer to its per-peer cap).
func listenRelay(path string, link *muxlink.Link, gid uint32) (*relay, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(os.Chown(path, 0, int(gid)), os.Chmod(path, 0o660)); err != nil {
		ln.Close()
		return nil, err
	}
	r := &relay{ln: ln}
	r.wg.Add(1)
	go r.serve(link)
	return r, nil
}

func (r *relay) serve(link *muxlink.Link) {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s, err := link.Open()
		if err != nil {
			c.Close()
			continue
		}
		r.wg.Add(1)
		go func() { defer r.wg.Done(); muxlink.Join(c, s) }()
	}
}

// Close stops accepting and removes the socket; connections in flight
// end when the link closes. Safe to call twice.
func (r *relay) Close() error {
	var err error
	r.once.Do(func() { err = r.ln.Close() })
	return err
}
