//go:build !linux

package qmpinput

import (
	"context"
	"errors"
	"fmt"
	"net"
)

var errUnimplemented = errors.New("pinned qmp transport (owner, mode and peer-credential checks) is implemented for linux only")

// dialPinned fails closed where the checks are not implemented.
func dialPinned(ctx context.Context, p string, owner uint32) (*net.UnixConn, error) {
	return nil, fmt.Errorf("%w: %w", ErrNotUnixSocket, errUnimplemented)
}
