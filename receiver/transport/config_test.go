package transport

import (
	"errors"
	"path/filepath"
	"testing"
)

func TestConfigTransport(t *testing.T) {
	w := newTLSWorld(t)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	w.ca.WriteCert(ca)
	crt, key, _ := w.client.WriteFiles(dir, "c")
	good := []struct {
		c    Config
		want string
	}{
		{Config{Kind: KindUnix, HostOnly: true, Path: "/run/tether/r.sock", PeerUIDs: []uint32{0}}, "unix:/run/tether/r.sock"},
		{Config{Kind: KindStream, HostOnly: true, Path: "/dev/vport0p1"}, "stream:/dev/vport0p1"},
		{Config{Kind: KindVsock, HostOnly: true, CID: 3, Port: 7000}, "vsock:3:7000"},
		{Config{Kind: KindTLS, Address: "127.0.0.1:7000", CAFile: ca, CertFile: crt, KeyFile: key,
			ServerName: "receiver.test", CASPKISHA256: w.ca.SPKISHA256()}, "tls:127.0.0.1:7000"},
	}
	for _, g := range good {
		tr, err := g.c.Transport(nil)
		if err != nil {
			t.Errorf("%+v: %v", g.c, err)
			continue
		}
		if tr.String() != g.want {
			t.Errorf("String() = %q, want %q", tr.String(), g.want)
		}
	}
	bad := map[string]struct {
		c    Config
		want error
	}{
		"unknown kind":         {Config{Kind: "carrier-pigeon"}, ErrConfig},
		"unix not host-only":   {Config{Kind: KindUnix, Path: "/x.sock"}, ErrNotHostOnly},
		"stream not host-only": {Config{Kind: KindStream, Path: "/dev/vport0p1"}, ErrNotHostOnly},
		"vsock not host-only":  {Config{Kind: KindVsock, CID: 3, Port: 1}, ErrNotHostOnly},
		"tls field on unix":    {Config{Kind: KindUnix, HostOnly: true, Path: "/x.sock", CAFile: ca}, ErrConfig},
		"port on stream":       {Config{Kind: KindStream, HostOnly: true, Path: "/dev/x", Port: 3}, ErrConfig},
		"host_only on tls":     {Config{Kind: KindTLS, HostOnly: true, Address: "a:1", CAFile: ca, CertFile: crt, KeyFile: key}, ErrConfig},
		"tls pin mismatch": {Config{Kind: KindTLS, Address: "a:1", CAFile: ca, CertFile: crt, KeyFile: key,
			ServerName: "r", CASPKISHA256: w.rogue.SPKISHA256()}, ErrConfig},
		"tls missing key": {Config{Kind: KindTLS, Address: "a:1", CAFile: ca, CertFile: crt, KeyFile: filepath.Join(dir, "none")}, ErrConfig},
	}
	for name, b := range bad {
		if _, err := b.c.Transport(nil); !errors.Is(err, b.want) {
			t.Errorf("%s: err = %v, want %v", name, err, b.want)
		}
	}
}
