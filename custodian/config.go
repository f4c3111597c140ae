package custodian

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/custodian/jail"
	"github.com/tetherdev/tether/custodian/longline"
	"github.com/tetherdev/tether/receiver/transport"
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
	// RefusalBudget is how many refused callbacks one session may cause
	// before it is fenced for good (Options.RefusalBudget); default 1000,
	// -1 none.
	RefusalBudget int `json:"refusal_budget,omitempty"`
	// AuditBudget is how many permission records, and how many attach
	// records, one session writes one by one per 5 s before the rest are
	// folded (Options.AuditBudget); default 32, -1 none.
	AuditBudget int `json:"audit_budget,omitempty"`
	// LongLines caps the agent messages over 10 MiB taken in at once
	// (Options.LongLines); default 4, -1 turns the long-line caps off.
	LongLines int `json:"long_lines,omitempty"`
	// LongLineBytes caps the bytes charged to them, twice each one's
	// length (Options.LongLineBytes); default 256 MiB.
	LongLineBytes int64 `json:"long_line_bytes,omitempty"`
	// Permission answers the agent's permission requests: "reject"
	// (default), "allow_once" or "allow_always" (PermissionPolicy).
	Permission string `json:"permission,omitempty"`
	// Agent is "tether" (default: the strict protocol the plugin speaks)
	// or "plain" (an agent that knows nothing of tether; Binding.Plain).
	Agent string `json:"agent,omitempty"`
	// SessionMeta is merged into the `_meta` of session/new and
	// session/load, next to `tether/bind` (per-agent session options, e.g.
	// claude-code-acp's claudeCode.options). Keys beginning with
	// "tether/" are refused.
	SessionMeta map[string]any `json:"session_meta,omitempty"`
	// Computer names the computer service that made the computer, when
	// one did: the custodian wakes the computer through it when it finds
	// it suspended, before it forwards a callback.
	Computer *ComputerRef `json:"computer,omitempty"`
	// Jail confines the agent process: allowlists that extend the
	// defaults, the network, the agent's ids (docs/custodian.md "The
	// agent jail").
	Jail jail.Config `json:"jail,omitempty"`
	// OpStore selects where operation keys and receipts live: absent or
	// kind "bbolt", the state directory; kind "etcd", a fleet's etcd
	// cluster, with session ownership and takeover (docs/operations.md).
	OpStore *OpStoreConfig `json:"op_store,omitempty"`
	// Witnesses receive every audit checkpoint `run` signs, in the
	// background; WitnessQuorum cosignatures (0: all of them) make a
	// checkpoint replace audit/checkpoint.cosigned (docs/operations.md).
	Witnesses     []WitnessConfig `json:"witnesses,omitempty"`
	WitnessQuorum int             `json:"witness_quorum,omitempty"`
}

// Agent kinds of Config.Agent.
const (
	AgentTether = "tether"
	AgentPlain  = "plain"
)

// ReceiverConfig names the receiver endpoint in the same vocabulary as
// the receiver's own listen entries (receiver/transport.Config):
//   - {"kind":"tls","address","server_name","ca_file","cert_file",
//     "key_file"[,"ca_spki_sha256"]}: mutual TLS 1.3, the receiver's
//     certificate signed directly by the one CA (pinned, no system roots);
//     with "path" (and optionally "peer_uids", default root) instead of
//     "address", the same over a unix socket whose listener's uid is
//     checked first (a computer in its own network namespace);
//   - {"kind":"unix","path","host_only":true[,"peer_uids"]}: a unix socket
//     (also QEMU's host end of a virtio-serial port);
//   - {"kind":"vsock","cid","port","host_only":true}.
//
// Channels without peer authentication require host_only. The TLS files
// are read through credfile: the certificate and key readable by their
// owner only, the CA file not writable by others.
type ReceiverConfig = transport.Config

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

// maxConfigBytes bounds the configuration file.
const maxConfigBytes = 1 << 20

// ParseConfig decodes a config whose relative paths are relative to dir.
func ParseConfig(data []byte, dir string) (*Config, error) {
	var c Config
	if err := strictjson.Decode(data, maxConfigBytes, &c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
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
	r := &c.Receiver
	if r.Kind == transport.KindUnix || r.Kind == transport.KindStream || r.Kind == transport.KindTLS {
		abs(&r.Path)
	}
	abs(&r.CAFile)
	abs(&r.CertFile)
	abs(&r.KeyFile)
	for i := range c.Jail.Read {
		abs(&c.Jail.Read[i])
	}
	for i := range c.Jail.Exec {
		abs(&c.Jail.Exec[i])
	}
	if c.OpStore != nil {
		c.OpStore.resolve(dir)
	}
}

// ComputerRef is the computer service's socket and the computer's id
// there (computer/api.ServiceRef, as the service writes it).
type ComputerRef struct {
	Socket string `json:"socket"`
	ID     string `json:"id"`
}

// Validate names the first failed check.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if r := c.Computer; r != nil && (!filepath.IsAbs(r.Socket) || r.ID == "") {
		return bad("computer: want an absolute socket and an id, got %q and %q", r.Socket, r.ID)
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
	case !validPermission(c.Permission):
		return bad("permission %q: want reject, allow_once or allow_always", c.Permission)
	case c.Agent != "" && c.Agent != AgentTether && c.Agent != AgentPlain:
		return bad("agent %q: want tether or plain", c.Agent)
	case c.Retention != 0 && time.Duration(c.Retention) < 24*time.Hour:
		return bad("retention %s is below the minimum 24h", time.Duration(c.Retention))
	case c.RefusalBudget < -1:
		return bad("refusal_budget %d: want a count, or -1 for none", c.RefusalBudget)
	case c.AuditBudget < -1:
		return bad("audit_budget %d: want a count, or -1 for none", c.AuditBudget)
	case c.LongLines < -1:
		return bad("long_lines %d: want a count, or -1 for no long-line caps", c.LongLines)
	case c.LongLineBytes < 0 || c.LongLineBytes > 0 && c.LongLineBytes < 2*longline.SDKLineMax:
		return bad("long_line_bytes %d: want at least %d (twice the longest line the SDK reads)", c.LongLineBytes, 2*longline.SDKLineMax)
	}
	for k := range c.SessionMeta {
		if strings.HasPrefix(k, "tether/") {
			return bad("session_meta key %q: the tether/ keys are the custodian's own", k)
		}
	}
	if err := c.Jail.Validate(); err != nil {
		return bad("%v", err)
	}
	if c.OpStore != nil {
		if err := c.OpStore.validate(); err != nil {
			return err
		}
	}
	if _, err := c.WitnessOptions(); err != nil {
		return err
	}
	return validateReceiver(c.Receiver)
}

// validateReceiver checks the endpoint's shape without reading files.
func validateReceiver(r ReceiverConfig) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: receiver: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch r.Kind {
	case transport.KindTLS:
		switch {
		case (r.Address == "") == (r.Path == "") || r.ServerName == "":
			return bad("tls needs server_name and exactly one of address and path (a unix socket)")
		case r.CAFile == "" || r.CertFile == "" || r.KeyFile == "":
			return bad("tls needs ca_file, cert_file and key_file")
		case r.HostOnly || r.SocketMode != 0 || r.Path == "" && len(r.PeerUIDs) > 0 || r.CID != 0 || r.Port != 0 || r.PeerCID != 0:
			return bad("tls takes only address or path (with peer_uids), server_name, ca_file, ca_spki_sha256, cert_file and key_file")
		}
		return nil
	case transport.KindUnix, transport.KindVsock, transport.KindStream:
		if !r.HostOnly {
			return bad("%s has no peer authentication: set host_only only if nothing but this host can reach it", r.Kind)
		}
		if _, err := r.Transport(nil); err != nil {
			return bad("%v", err)
		}
		return nil
	}
	return bad("kind %q: want tls, unix, vsock or stream (plaintext tcp is refused)", r.Kind)
}
