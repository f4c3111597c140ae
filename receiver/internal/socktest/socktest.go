// Package socktest gives the receiver's tests a real AF_UNIX stream
// socketpair. Test code only.
package socktest

import (
	"net"
	"os"
	"syscall"
	"testing"
)

// Pair returns the two ends ("client", "server") of a real AF_UNIX
// stream socketpair; both are closed when t ends.
func Pair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int, name string) net.Conn {
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0], "client"), conn(fds[1], "server")
}
