package qmpinput

import (
	"context"
	"net"
)

// DialPinned connects to the unix socket at path with the same pins as the
// QMP transport: an absolute clean path naming a socket (not a symlink),
// socket and directory owned by owner (the directory may be root's) and
// not writable by group or others (unless the directory is sticky), the
// connected process running as owner (SO_PEERCRED), and the path still
// naming the checked socket after connecting. The view server uses it for
// QEMU's VNC socket. The caller closes the connection.
func DialPinned(ctx context.Context, path string, owner uint32) (*net.UnixConn, error) {
	return dialPinned(ctx, path, owner)
}
