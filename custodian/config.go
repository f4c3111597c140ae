package custodian

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/admission"
)

// Config is the JSON file of `tether-custodian run --config FILE`
// (docs/custodian.md). Relative paths are taken relative to the file's
// directory. Unknown fields are refused.
type Config struct {
	// Tuple is the allocation every session of this run binds to.
	Tuple admission.Tuple `json:"tuple"`
	// LeaseNotAfter ends the lease (RFC 3339); nothing runs after it.
	LeaseNotAfter time.Time `json:"lease_not_after"`
	// Principal is the identity the custodian acts for; it must be the
	// tuple's owner.
	Principal string `json:"principal"`
	// Receiver is the endpoint and its credentials.
	Receiver ReceiverConfig `json:"receiver"`
	// StateDir holds receipts (opkeys/) and the audit log (audit/).
	StateDir string `json:"state_dir"`
	// AuditKeyFile is the note signing key of audit checkpoints (mode
	// 0600 or 0400, owned by this user or root).
	AuditKeyFile string `json:"audit_key_file"`
	// CommandBudget caps every callback's deadline ("10m"); default 10m.
	CommandBudget Duration `json:"command_budget,omitempty"`
	// Retention keeps operation keys ("48h"); default and minimum 24h.
	Retention Duration `json:"retention,omitempty"`
	// Permission answers the agent's permission requests: "reject"
	// (default) or "allow_once".
	Permission string `json:"permission,omitempty"`
}

// ReceiverConfig names the receiver endpoint. Exactly one transport:
//   - "tcp": Address host:port with mutual TLS 1.3; TLS is required and
//     ServerName must match the receiver's certificate;
//   - "unix": Path of a unix socket (also QEMU's host end of a
//     virtio-serial port); HostOnly must be true, as nothing
//     authenticates the peer but its uid.
type ReceiverConfig struct {
	Transport  string     `json:"transport"`
	Address    string     `json:"address,omitempty"`
	ServerName string     `json:"server_name,omitempty"`
	Path       string     `json:"path,omitempty"`
	HostOnly   bool       `json:"host_only,omitempty"`
	TLS        *TLSConfig `json:"tls,omitempty"`
	// PeerUIDs are the uids a unix-socket peer may run as (default: root
	// and this user).
	PeerUIDs []uint32 `json:"peer_uids,omitempty"`
}

// TLSConfig names the credential files of the mutual TLS transport. The
// certificate and key must be readable by their owner only; the issuer
// certificate may be world-readable but writable by its owner only. Every
// file must be owned by this user or root.
type TLSConfig struct {
	// Cert and Key are the custodian's client certificate and key (PEM).
	Cert string `json:"cert"`
	Key  string `json:"key"`
	// Issuer is the one CA certificate (PEM) whose key must have signed
	// the receiver's certificate; no system roots are used.
	Issuer string `json:"issuer"`
}

// Duration is a time.Duration written as a Go duration string in JSON.
type Duration time.Duration

// UnmarshalJSON parses "90s", "10m", "24h".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"10m\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("duration %q: want a non-negative Go duration", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// LoadConfig reads, strictly decodes and validates a config file.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return ParseConfig(data, filepath.Dir(path))
}

// ParseConfig decodes a config whose relative paths are relative to dir.
func ParseConfig(data []byte, dir string) (*Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the config object", ErrConfig)
	}
	c.resolve(dir)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) resolve(dir string) {
	abs := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	abs(&c.StateDir)
	abs(&c.AuditKeyFile)
	abs(&c.Receiver.Path)
	if t := c.Receiver.TLS; t != nil {
		abs(&t.Cert)
		abs(&t.Key)
		abs(&t.Issuer)
	}
}

// Validate names the first failed check.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if err := c.Tuple.Validate(); err != nil {
		return bad("tuple: %v", err)
	}
	switch {
	case c.LeaseNotAfter.IsZero():
		return bad("lease_not_after is required")
	case c.Principal == "":
		return bad("principal is required")
	case c.Principal != c.Tuple.Owner:
		return bad("principal %q is not the tuple's owner %q", c.Principal, c.Tuple.Owner)
	case c.StateDir == "":
		return bad("state_dir is required")
	case c.AuditKeyFile == "":
		return bad("audit_key_file is required")
	case c.Permission != "" && c.Permission != "reject" && c.Permission != "allow_once":
		return bad("permission %q: want reject or allow_once", c.Permission)
	case c.Retention != 0 && time.Duration(c.Retention) < 24*time.Hour:
		return bad("retention %s is below the minimum 24h", time.Duration(c.Retention))
	}
	return c.Receiver.validate()
}

func (r *ReceiverConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: receiver: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch r.Transport {
	case "tcp":
		switch {
		case r.Address == "":
			return bad("tcp needs address host:port")
		case r.TLS == nil || r.TLS.Cert == "" || r.TLS.Key == "" || r.TLS.Issuer == "":
			return bad("tcp needs tls {cert, key, issuer}: plaintext is refused")
		case r.ServerName == "":
			return bad("tcp needs server_name (the name in the receiver's certificate)")
		case r.Path != "" || r.HostOnly:
			return bad("path and host_only are for the unix transport")
		}
	case "unix":
		switch {
		case r.Path == "":
			return bad("unix needs path")
		case !r.HostOnly:
			return bad("unix has no peer authentication: set host_only only if nothing but this host can reach the socket")
		case r.TLS != nil || r.Address != "":
			return bad("tls and address are for the tcp transport")
		}
	default:
		return bad("transport %q: want tcp or unix", r.Transport)
	}
	return nil
}
