package wire

import (
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/tetherdev/tether/receiver/internal/socktest"
)

// peerConn is a real socket whose remote address claims a TCP source, so
// PeerOf names it ip:ADDR.
type peerConn struct {
	net.Conn
	remote net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.remote }

func tcpFrom(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000} }

func TestPeerOf(t *testing.T) {
	c, _ := socktest.Pair(t)
	cases := map[string]any{
		"ip:loopback":    peerConn{Conn: c, remote: tcpFrom("127.9.9.9")},
		"ip:10.0.2.2":    peerConn{Conn: c, remote: tcpFrom("10.0.2.2")},
		"ip:2001:db8::1": peerConn{Conn: c, remote: tcpFrom("2001:db8::1")},
		"ip:loopback ":   peerConn{Conn: c, remote: tcpFrom("::1")},
		"stream":         struct{ io.ReadWriteCloser }{},
	}
	for want, conn := range cases {
		if got := PeerOf(conn); got != strings.TrimSpace(want) {
			t.Errorf("PeerOf(%s) = %q", want, got)
		}
	}
	if got, want := PeerOf(c), "uid:"+strconv.Itoa(os.Geteuid()); got != want {
		t.Errorf("PeerOf(unix socket) = %q, want %q", got, want)
	}
}
