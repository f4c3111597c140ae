package wire

import (
	"net"
	"syscall"
)

// peerUID reads SO_PEERCRED of a unix socket connection.
func peerUID(nc net.Conn) (uint32, bool) {
	if _, isUnix := nc.LocalAddr().(*net.UnixAddr); !isUnix {
		return 0, false
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return 0, false
	}
	return cred.Uid, true
}
