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

// PeerUID fails closed where SO_PEERCRED is not implemented.
func PeerUID(c *net.UnixConn) (uint32, error) {
	return 0, fmt.Errorf("%w: %w", ErrSocketOwner, errUnimplemented)
}
