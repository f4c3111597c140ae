package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/tetherdev/tether/egress/policy"
)

// Limits bound one computer's use of the proxy. A zero field takes its
// default; a negative one means no limit.
type Limits struct {
	// Conns is how many connections the computer may hold open at once,
	// including those still sending their request (default 256). A
	// connection over the limit is refused at once.
	Conns int
	// BytesPerSecond bounds the computer's traffic, both ways together,
	// over all its connections (default 64 MiB/s).
	BytesPerSecond int64
	// TotalBytes bounds the computer's traffic over its life (default
	// 64 GiB); at the limit its connections close and new ones are refused.
	TotalBytes int64
	// AcceptsPerSecond bounds how fast the proxy takes new connections
	// from the computer (default 1000, in bursts of Conns, or of
	// DefaultConns where Conns is unlimited); the rest wait in the
	// listener's backlog. Every connection is one record of the egress
	// log, so this bounds how fast one computer grows it.
	AcceptsPerSecond int64
}

// Defaults.
const (
	DefaultConns          = 256
	DefaultBytesPerSecond = 64 << 20
	DefaultTotalBytes     = 64 << 30
	DefaultAccepts        = 1000
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultDialTimeout    = 10 * time.Second
)

// Config is the proxy's configuration, written by the host's operator.
type Config struct {
	// Presets are the named rule sets a policy may refer to; none is on
	// unless a policy names it. Only a preset may lift a special range
	// (AllowCIDRs).
	Presets []policy.Preset
	// DNS is the server the proxy asks ("host:port"); empty means the
	// servers of the host's resolv.conf.
	DNS string
	// Limits apply to each computer.
	Limits Limits
	// LogPath is the egress log (egresslog); required. An existing log
	// must verify, and its chain is continued.
	LogPath string
	// HeaderTimeout bounds how long a connection may take to send its
	// request: the HTTP head, the SOCKS5 handshake, and a tunnel's TLS
	// ClientHello (default 10 s). It is the slowloris bound.
	HeaderTimeout time.Duration
	// DialTimeout bounds resolving and connecting (default 10 s).
	DialTimeout time.Duration
	// HostAddrs are the host's own addresses, refused like loopback
	// unless lifted. Nil means the addresses of the host's interfaces
	// when New runs.
	HostAddrs []netip.Addr
}

// withDefaults returns cfg with its zero fields set and checks the rest.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.LogPath == "" {
		return cfg, errors.New("egress: Config.LogPath is required")
	}
	seen := map[string]bool{}
	for i, p := range cfg.Presets {
		if err := p.Validate(); err != nil {
			return cfg, fmt.Errorf("egress: presets[%d]: %w", i, err)
		}
		if seen[p.Name] {
			return cfg, fmt.Errorf("egress: preset %q twice", p.Name)
		}
		seen[p.Name] = true
	}
	cfg.Limits.Conns = orDefault(cfg.Limits.Conns, DefaultConns)
	cfg.Limits.BytesPerSecond = orDefault(cfg.Limits.BytesPerSecond, DefaultBytesPerSecond)
	cfg.Limits.TotalBytes = orDefault(cfg.Limits.TotalBytes, DefaultTotalBytes)
	cfg.Limits.AcceptsPerSecond = orDefault(cfg.Limits.AcceptsPerSecond, DefaultAccepts)
	cfg.HeaderTimeout = orDefault(cfg.HeaderTimeout, DefaultHeaderTimeout)
	cfg.DialTimeout = orDefault(cfg.DialTimeout, DefaultDialTimeout)
	return cfg, nil
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}
