package provision

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/pki"
	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/receiver"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// ServerName is the DNS name in every receiver certificate; custodians
// verify it.
const ServerName = "receiver.tether.internal"

// Credentials are one computer's own CA, whose key never leaves memory,
// and the two certificates it signs: the receiver's server certificate
// (ServerName and 127.0.0.1) and the custodian's client certificate.
// Local and fixtures/vmcomputer's VM each mint their own.
type Credentials struct {
	CA     *pki.CA
	Server *pki.Leaf
	Client *pki.Leaf
}

// NewCredentials mints a CA named name, the receiver's certificate and a
// client certificate for owner's custodian. Nothing is written.
func NewCredentials(name, owner string) (*Credentials, error) {
	ca, err := pki.NewCA(name)
	if err != nil {
		return nil, err
	}
	server, err := ca.Server(ServerName, "127.0.0.1")
	if err != nil {
		return nil, err
	}
	client, err := ca.Client("custodian for " + owner)
	if err != nil {
		return nil, err
	}
	return &Credentials{CA: ca, Server: server, Client: client}, nil
}

// CustodianFiles are the custodian's credential files.
type CustodianFiles struct {
	Cert string // the client certificate (0600)
	Key  string // its private key (0600)
	CA   string // the CA certificate the custodian pins (0644)
}

// CustodianFilesIn names the custodian's files in dir: custodian.crt,
// custodian.key and issuer.crt.
func CustodianFilesIn(dir string) CustodianFiles {
	return CustodianFiles{Cert: filepath.Join(dir, "custodian.crt"), Key: filepath.Join(dir, "custodian.key"),
		CA: filepath.Join(dir, "issuer.crt")}
}

// WriteCustodian writes the custodian's files, each created exclusively
// with its mode and owned by uid:gid: the custodian reads its certificate
// and key only if no one else can.
func (c *Credentials) WriteCustodian(f CustodianFiles, uid, gid uint32) error {
	keyPEM, err := c.Client.KeyPEM()
	if err != nil {
		return err
	}
	for _, w := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{{f.Cert, c.Client.CertPEM(), 0o600}, {f.Key, keyPEM, 0o600}, {f.CA, c.CA.CertPEM(), 0o644}} {
		if err := writeFile(w.path, w.data, w.mode, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// ReceiverFiles are where a receiver finds its credentials.
type ReceiverFiles struct {
	Cert string // its server certificate (0644)
	Key  string // its private key (0600)
	CA   string // the CA certificate its clients must chain to (0644)
}

// ReceiverFilesIn names the receiver's files in dir: receiver.crt,
// receiver.key and issuer.crt.
func ReceiverFilesIn(dir string) ReceiverFiles {
	return ReceiverFiles{Cert: filepath.Join(dir, "receiver.crt"), Key: filepath.Join(dir, "receiver.key"),
		CA: filepath.Join(dir, "issuer.crt")}
}

// ListenTLS is the receiver's listener: TLS on address with the files f,
// client certificates pinned to this CA.
func (c *Credentials) ListenTLS(address string, f ReceiverFiles) transport.Config {
	return transport.Config{Kind: transport.KindTLS, Address: address, CAFile: f.CA,
		CASPKISHA256: c.CA.SPKISHA256(), CertFile: f.Cert, KeyFile: f.Key}
}

// ListenTLSUnix is the receiver's listener on a namespaced computer: the
// same mutual TLS over the unix socket at path (mode 0666, reachable
// only through its 0750 directory), whose peers must run as one of uids.
func (c *Credentials) ListenTLSUnix(path string, f ReceiverFiles, uids ...uint32) transport.Config {
	return transport.Config{Kind: transport.KindTLS, Path: path, SocketMode: 0o666, PeerUIDs: uids, CAFile: f.CA,
		CASPKISHA256: c.CA.SPKISHA256(), CertFile: f.Cert, KeyFile: f.Key}
}

// ReceiverSettings are what a computer decides of its receiver's
// configuration; ReceiverConfig writes them out.
type ReceiverSettings struct {
	Listen        transport.Config
	AdmissionFile string // the admission file, owned by root
	PublicKey     string // the signer's public key the receiver pins
	Landlock      receiver.LandlockConfig
	Cgroup        receiver.CgroupConfig
	// Seccomp is the filter's mode; "" is receiver.SeccompRequired.
	Seccomp string
	// ChildEnv is the commands' default environment; nil is the
	// receiver's default.
	ChildEnv map[string]string
	// FenceState is the receiver's fence state file; "" keeps none.
	FenceState string
}

// ReceiverConfig returns tether-receiver's configuration file
// (docs/protocol.md, "Config") as indented JSON: the one listener, the
// admission file and the signer's public key it pins (the file owned by
// root), the Landlock configuration, the cgroup containment (its mode
// always written out, "off" included), the seccomp filter, the commands'
// default environment and the fence state file, which every computer
// keeps from the start so that a fleet custodian's fencing token is
// honoured without a manual step (docs/operations.md "Fencing").
func ReceiverConfig(s ReceiverSettings) ([]byte, error) {
	cgroup := s.Cgroup
	if cgroup.Mode == CgroupAuto {
		cgroup.Mode = CgroupOff
	}
	seccomp := s.Seccomp
	if seccomp == "" {
		seccomp = receiver.SeccompRequired
	}
	cfg := map[string]any{
		"listen":      []any{s.Listen},
		"admission":   map[string]any{"file": s.AdmissionFile, "public_key": s.PublicKey, "owner_uid": 0},
		"landlock":    s.Landlock,
		"cgroup":      cgroup,
		"seccomp":     receiver.SeccompConfig{Mode: seccomp},
		"fence_state": s.FenceState,
	}
	if s.ChildEnv != nil {
		cfg["child_env"] = s.ChildEnv
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// Receiver is the custodian's configuration of the receiver at address:
// TLS verifying ServerName, pinned to this CA, with the files f
// (Computer.Receiver).
func (c *Credentials) Receiver(address string, f CustodianFiles) custodian.ReceiverConfig {
	return custodian.ReceiverConfig{Kind: transport.KindTLS, Address: address, ServerName: ServerName,
		CAFile: f.CA, CASPKISHA256: c.CA.SPKISHA256(), CertFile: f.Cert, KeyFile: f.Key}
}

// ReceiverUnix is the custodian's configuration of the receiver whose
// TLS runs over the unix socket at path (a namespaced computer).
func (c *Credentials) ReceiverUnix(path string, f CustodianFiles) custodian.ReceiverConfig {
	return custodian.ReceiverConfig{Kind: transport.KindTLS, Path: path, ServerName: ServerName,
		CAFile: f.CA, CASPKISHA256: c.CA.SPKISHA256(), CertFile: f.Cert, KeyFile: f.Key}
}

// DialTLSUnix is DialTLS over the unix socket at path.
func (c *Credentials) DialTLSUnix(ctx context.Context, path string, handshake time.Duration) (io.ReadWriteCloser, error) {
	t := transport.TLS{Path: path, CA: c.CA.Cert, CASPKISHA256: c.CA.SPKISHA256(),
		Certificate: c.Client.TLSCertificate(), ServerName: ServerName, HandshakeTimeout: handshake}
	return t.Dial(ctx)
}

// DialTLS connects to the receiver listening on address as the custodian
// would, with the client certificate held in memory (the files may belong
// to another uid); the TLS handshake may take at most handshake. The
// caller owns the stream and closes it.
func (c *Credentials) DialTLS(ctx context.Context, address string, handshake time.Duration) (io.ReadWriteCloser, error) {
	t := transport.TLS{Address: address, CA: c.CA.Cert, CASPKISHA256: c.CA.SPKISHA256(),
		Certificate: c.Client.TLSCertificate(), ServerName: ServerName, HandshakeTimeout: handshake}
	return t.Dial(ctx)
}

// Dialer connects to a computer's receiver as the custodian would; Local
// and fixtures/vmcomputer's VM are Dialers. The caller owns the stream.
type Dialer interface {
	Dial(ctx context.Context) (io.ReadWriteCloser, error)
}

var _ Dialer = (*Local)(nil)

// WireClient connects to the receiver d reaches, as the custodian would,
// and returns a wire client on the new stream. The caller closes the
// client, which closes the stream.
func WireClient(ctx context.Context, d Dialer) (*wireclient.Client, error) {
	conn, err := d.Dial(ctx)
	if err != nil {
		return nil, err
	}
	wc, err := wireclient.NewClient(conn, wireclient.ClientConfig{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return wc, nil
}

// AttachVia asks the receiver d reaches, over a fresh connection, whether
// a current grant covers t: what the custodian does for `_tether/attach`.
// The connection is closed before it returns.
func AttachVia(ctx context.Context, d Dialer, t admission.Tuple) (wire.AttachResult, error) {
	return AttachFencedVia(ctx, d, t, 0)
}

// AttachFencedVia is AttachVia as a fleet custodian sends it: with its
// fencing token (0 sends none). A computer's receiver keeps a fence state,
// so it honours the token, or refuses it as fenced when it is below the
// highest it has seen for t.
func AttachFencedVia(ctx context.Context, d Dialer, t admission.Tuple, token uint64) (wire.AttachResult, error) {
	var res wire.AttachResult
	wc, err := WireClient(ctx, d)
	if err != nil {
		return res, err
	}
	defer wc.Close()
	key, err := randomHex(8)
	if err != nil {
		return res, err
	}
	err = wc.CallFenced(ctx, wire.OpAttach, t.SHA256(), "computer-attach-"+key, token, time.Now().Add(10*time.Second),
		wire.AttachArgs{}, &res)
	return res, err
}
