package qmpinput

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// socketID identifies the socket file that was checked.
type socketID struct{ dev, ino uint64 }

// checkSocketPath refuses anything but an absolute clean path naming a unix
// socket (not a symlink) owned by owner and not writable by group or
// others, inside a directory owned by owner or root that others cannot
// write (or that is sticky).
func checkSocketPath(p string, owner uint32) (socketID, error) {
	if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
		return socketID{}, fmt.Errorf("%w: %q (give the absolute path of QEMU's -qmp unix socket; TCP and other networks are refused)", ErrNotUnixSocket, p)
	}
	dir := filepath.Dir(p)
	dst, err := lstat(dir)
	if err != nil {
		return socketID{}, fmt.Errorf("%w: socket directory: %w", ErrNotUnixSocket, err)
	}
	if dst.Mode&unix.S_IFMT != unix.S_IFDIR {
		return socketID{}, fmt.Errorf("%w: socket directory %s is not a directory", ErrNotUnixSocket, dir)
	}
	if dst.Uid != owner && dst.Uid != 0 {
		return socketID{}, &OwnerError{What: "socket directory", Path: dir, Want: owner, Got: dst.Uid}
	}
	if dst.Mode&0o022 != 0 && dst.Mode&unix.S_ISVTX == 0 {
		return socketID{}, &ModeError{What: "socket directory", Path: dir, Mode: os.FileMode(dst.Mode & 0o7777)}
	}
	st, err := lstat(p)
	if err != nil {
		return socketID{}, fmt.Errorf("%w: %w", ErrNotUnixSocket, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return socketID{}, fmt.Errorf("%w: %s is not a unix socket (symlinks are refused)", ErrNotUnixSocket, p)
	}
	if st.Uid != owner {
		return socketID{}, &OwnerError{What: "socket", Path: p, Want: owner, Got: st.Uid}
	}
	if st.Mode&0o022 != 0 {
		return socketID{}, &ModeError{What: "socket", Path: p, Mode: os.FileMode(st.Mode & 0o777)}
	}
	return socketID{dev: st.Dev, ino: st.Ino}, nil
}

func lstat(p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Lstat(p, &st)
	return st, err
}

// dialPinned checks the socket path, connects, checks that the process at
// the other end runs as owner (SO_PEERCRED) and that the path still names
// the socket that was checked.
func dialPinned(ctx context.Context, p string, owner uint32) (*net.UnixConn, error) {
	id, err := checkSocketPath(p, owner)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", p)
	if err != nil {
		return nil, fmt.Errorf("dial qmp socket %s: %w", p, err)
	}
	uc := c.(*net.UnixConn)
	if err := checkPeer(uc, p, owner); err != nil {
		uc.Close()
		return nil, err
	}
	if again, err := checkSocketPath(p, owner); err != nil || again != id {
		uc.Close()
		return nil, fmt.Errorf("%w: %s (%v)", ErrSocketChanged, p, err)
	}
	return uc, nil
}

// checkPeer compares the connected process's uid with owner.
func checkPeer(c *net.UnixConn, p string, owner uint32) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("%w: SO_PEERCRED: %w", ErrSocketOwner, cerr)
	}
	if cred.Uid != owner {
		return &OwnerError{What: "peer process", Path: p, Want: owner, Got: cred.Uid}
	}
	return nil
}

// PeerUID returns the uid of the process at the other end of c
// (SO_PEERCRED).
func PeerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("%w: SO_PEERCRED: %w", ErrSocketOwner, cerr)
	}
	return cred.Uid, nil
}
