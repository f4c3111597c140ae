package vmguest

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/mdlayher/vsock"
)

// dialHost connects to the host (context id 2) on port, retrying until
// wait has passed: the vsock transport's driver may still be probing.
// The guest listens on no vsock port: any process of the host could
// connect to it, while the host's port is bound by root alone and the
// host takes one connection from this guest's context id (computer/vm,
// vsock.go). The caller closes the connection, which ends the link.
func dialHost(port uint32, wait time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		c, err := vsock.DialContext(ctx, vsock.Host, port, nil)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial the host's vsock port %d: %w", port, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
