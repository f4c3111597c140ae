package wire

import (
	"net"
	"strconv"
	"strings"
)

// PeerOf names the peer a connection comes from, for the per-peer caps
// (docs/protocol.md "Limits"):
//   - TCP: "ip:ADDRESS", the source address without the port; every
//     loopback address (127.0.0.0/8, ::1, and their IPv4-mapped forms) is
//     the one peer "ip:loopback", so a process cannot multiply its quota
//     by binding 127.0.0.2, 127.0.0.3, ...;
//   - a unix socket: "uid:N", the peer's uid from SO_PEERCRED (its address
//     is usually unnamed);
//   - anything else: the network and the remote address without a final
//     ":port" (a vsock peer is its context id), or "stream" for a
//     connection that is not a net.Conn (a byte stream has one peer).
//
// A TLS connection is named by the connection beneath it.
func PeerOf(c any) string {
	if n, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = n.NetConn()
	}
	nc, ok := c.(net.Conn)
	if !ok {
		return "stream"
	}
	addr := nc.RemoteAddr()
	if a, ok := addr.(*net.TCPAddr); ok {
		return tcpPeer(a.IP)
	}
	if uid, ok := peerUID(nc); ok {
		return "uid:" + strconv.FormatUint(uint64(uid), 10)
	}
	if addr == nil {
		return "unknown"
	}
	s := addr.String()
	if i := strings.LastIndexByte(s, ':'); i > 0 {
		s = s[:i]
	}
	return addr.Network() + ":" + s
}

func tcpPeer(ip net.IP) string {
	if ip.IsLoopback() {
		return "ip:loopback"
	}
	return "ip:" + ip.String()
}
