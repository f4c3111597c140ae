//go:build !linux

package httpserver

import (
	"errors"
	"net"
)

// errUnimplemented: peer credentials are read with Linux's SO_PEERCRED.
var errUnimplemented = errors.New("httpserver: the unix-socket listener needs Linux (SO_PEERCRED)")

// ListenUnix is Linux only.
func ListenUnix(path string, policy PeerPolicy, audit func(AuditRecord)) (*PeerListener, error) {
	return nil, errUnimplemented
}

// Accept is Linux only.
func (l *PeerListener) Accept() (net.Conn, error) { return nil, errUnimplemented }
