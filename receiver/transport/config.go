package transport

import (
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
)

// Kind names a transport in configuration files.
type Kind string

// The four kinds.
const (
	KindUnix   Kind = "unix"
	KindTLS    Kind = "tls"
	KindVsock  Kind = "vsock"
	KindStream Kind = "stream"
)

// Config is the JSON form of one transport, for the receiver's and the
// custodian's configuration files (docs/protocol.md, "Transports"). Only
// the fields of the chosen kind may be set; any other set field is an
// error, so a misplaced setting is never silently ignored.
type Config struct {
	Kind Kind `json:"kind"`
	// HostOnly: required true for unix, stream and vsock.
	HostOnly bool `json:"host_only,omitempty"`
	// Path: unix (socket path), stream (character device) and tls over a
	// unix socket.
	Path string `json:"path,omitempty"`
	// SocketMode, PeerUIDs: unix and tls over a unix socket (see Unix).
	SocketMode uint32   `json:"socket_mode,omitempty"`
	PeerUIDs   []uint32 `json:"peer_uids,omitempty"`
	// Address, CAFile, CASPKISHA256, CertFile, KeyFile, ServerName: tls;
	// a tls channel over a unix socket sets Path (and may set SocketMode
	// and PeerUIDs) instead of Address.
	Address      string `json:"address,omitempty"`
	CAFile       string `json:"ca_file,omitempty"`
	CASPKISHA256 string `json:"ca_spki_sha256,omitempty"`
	CertFile     string `json:"cert_file,omitempty"`
	KeyFile      string `json:"key_file,omitempty"`
	ServerName   string `json:"server_name,omitempty"`
	// CID, Port, PeerCID: vsock.
	CID     uint32 `json:"cid,omitempty"`
	Port    uint32 `json:"port,omitempty"`
	PeerCID uint32 `json:"peer_cid,omitempty"`
}

// fieldsOf lists, for each kind, the fields it may set.
var fieldsOf = map[Kind][]string{
	KindUnix:   {"host_only", "path", "socket_mode", "peer_uids"},
	KindStream: {"host_only", "path"},
	KindTLS:    {"address", "path", "socket_mode", "peer_uids", "ca_file", "ca_spki_sha256", "cert_file", "key_file", "server_name"},
	KindVsock:  {"host_only", "cid", "port", "peer_cid"},
}

// setFields names the fields of c that are not zero.
func (c Config) setFields() []string {
	set := map[string]bool{
		"host_only": c.HostOnly, "path": c.Path != "", "socket_mode": c.SocketMode != 0,
		"peer_uids": len(c.PeerUIDs) > 0, "address": c.Address != "", "ca_file": c.CAFile != "",
		"ca_spki_sha256": c.CASPKISHA256 != "", "cert_file": c.CertFile != "", "key_file": c.KeyFile != "",
		"server_name": c.ServerName != "", "cid": c.CID != 0, "port": c.Port != 0, "peer_cid": c.PeerCID != 0,
	}
	var out []string
	for k, v := range set {
		if v {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Transport checks c and builds its transport; for tls it reads the
// certificate files now. log receives refused peers (nil discards).
func (c Config) Transport(log *slog.Logger) (Transport, error) {
	allowed, ok := fieldsOf[c.Kind]
	if !ok {
		return nil, fmt.Errorf("%w: kind %q is not one of unix, tls, vsock, stream", ErrConfig, c.Kind)
	}
	var stray []string
	for _, f := range c.setFields() {
		if !slices.Contains(allowed, f) {
			stray = append(stray, f)
		}
	}
	if len(stray) > 0 {
		return nil, fmt.Errorf("%w: %s set for kind %s", ErrConfig, strings.Join(stray, ", "), c.Kind)
	}
	if c.Kind != KindTLS {
		if err := requireHostOnly(string(c.Kind), c.HostOnly); err != nil {
			return nil, err
		}
	}
	switch c.Kind {
	case KindUnix:
		return Unix{Path: c.Path, HostOnly: c.HostOnly, Mode: fs.FileMode(c.SocketMode), PeerUIDs: c.PeerUIDs, Log: log}, nil
	case KindStream:
		return Stream{Path: c.Path, HostOnly: c.HostOnly, Log: log}, nil
	case KindVsock:
		return Vsock{CID: c.CID, Port: c.Port, PeerCID: c.PeerCID, HostOnly: c.HostOnly, Log: log}, nil
	}
	if c.Path == "" && (c.SocketMode != 0 || len(c.PeerUIDs) > 0) {
		return nil, fmt.Errorf("%w: socket_mode and peer_uids need a tls path (a unix socket)", ErrConfig)
	}
	t, err := LoadTLS(c.Address, c.CAFile, c.CertFile, c.KeyFile)
	if err != nil {
		return nil, err
	}
	t.CASPKISHA256, t.ServerName, t.Log = c.CASPKISHA256, c.ServerName, log
	t.Path, t.SocketMode, t.PeerUIDs = c.Path, fs.FileMode(c.SocketMode), c.PeerUIDs
	if t.Path != "" {
		if err := t.checkUnixPath(); err != nil {
			return nil, err
		}
	}
	if _, err := t.config(c.ServerName == ""); err != nil { // fail now, not at first dial
		return nil, err
	}
	return t, nil
}
