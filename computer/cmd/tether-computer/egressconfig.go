package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/metrics"
	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/policy"
)

// maxEgressConfig bounds the operator's egress configuration file.
const maxEgressConfig = 1 << 20

// EgressLogFile is the egress log's name in the state directory when the
// configuration names none.
const EgressLogFile = "egress.log"

// egressConfig is the operator's egress configuration, the JSON file of
// `serve --egress-config` (docs/operations.md "Egress"):
//
//	{"presets": [{"name": "pypi", "allow": [{"host": "pypi.org"}, {"host": "files.pythonhosted.org"}]},
//	             {"name": "mirror", "allow": [{"host": "mirror.internal"}], "allow_cidrs": ["10.20.0.0/16"]}],
//	 "dns": "192.0.2.53:53",
//	 "limits": {"conns": 256, "bytes_per_second": 67108864, "total_bytes": 68719476736},
//	 "log": "/var/lib/tether-computer/egress.log",
//	 "header_timeout_s": 10, "dial_timeout_s": 10}
//
// Every field is optional: no preset, the host's resolv.conf, the
// proxy's default limits and timeouts, the log in the state directory.
type egressConfig struct {
	Presets        []policy.Preset `json:"presets,omitempty"`
	DNS            string          `json:"dns,omitempty"`
	Limits         egressLimits    `json:"limits,omitzero"`
	Log            string          `json:"log,omitempty"`
	HeaderTimeoutS int64           `json:"header_timeout_s,omitempty"`
	DialTimeoutS   int64           `json:"dial_timeout_s,omitempty"`
}

// egressLimits bound each computer's use of the proxy; zero takes the
// proxy's default, -1 means no limit.
type egressLimits struct {
	Conns          int   `json:"conns,omitempty"`
	BytesPerSecond int64 `json:"bytes_per_second,omitempty"`
	TotalBytes     int64 `json:"total_bytes,omitempty"`
}

// loadEgressConfig reads and checks the configuration at path: a regular
// file no one but its owner may write (a preset can open private
// ranges), strict JSON, valid presets named once, a host:port DNS
// server, an absolute log path (empty: EgressLogFile in stateDir).
func loadEgressConfig(path, stateDir string) (egressConfig, error) {
	var c egressConfig
	fi, err := os.Stat(path)
	if err != nil {
		return c, fmt.Errorf("--egress-config: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 {
		return c, fmt.Errorf("--egress-config %s: mode %s; want a regular file writable by its owner only", path, fi.Mode())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("--egress-config: %w", err)
	}
	if err := strictjson.Decode(b, maxEgressConfig, &c); err != nil {
		return c, fmt.Errorf("--egress-config %s: %w", path, err)
	}
	if err := c.check(); err != nil {
		return c, fmt.Errorf("--egress-config %s: %w", path, err)
	}
	if c.Log == "" {
		c.Log = filepath.Join(stateDir, EgressLogFile)
	}
	return c, nil
}

// check refuses what the proxy could not run with.
func (c egressConfig) check() error {
	seen := map[string]bool{}
	for i, p := range c.Presets {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("presets[%d]: %w", i, err)
		}
		if seen[p.Name] {
			return fmt.Errorf("preset %q twice", p.Name)
		}
		seen[p.Name] = true
	}
	if c.DNS != "" {
		host, port, err := net.SplitHostPort(c.DNS)
		if n, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || n == 0 || net.ParseIP(host) == nil {
			return fmt.Errorf("dns %q: want an IP address and a port (192.0.2.53:53)", c.DNS)
		}
	}
	if c.Log != "" && !filepath.IsAbs(c.Log) {
		return fmt.Errorf("log %q is not absolute", c.Log)
	}
	for _, v := range []struct {
		name string
		v    int64
	}{{"limits.conns", int64(c.Limits.Conns)}, {"limits.bytes_per_second", c.Limits.BytesPerSecond},
		{"limits.total_bytes", c.Limits.TotalBytes}, {"header_timeout_s", c.HeaderTimeoutS}, {"dial_timeout_s", c.DialTimeoutS}} {
		if v.v < -1 || (v.v == -1 && (v.name == "header_timeout_s" || v.name == "dial_timeout_s")) {
			return fmt.Errorf("%s is %d; want 0 (the default) or more", v.name, v.v)
		}
	}
	return nil
}

// proxyConfig is the proxy's configuration the file says.
func (c egressConfig) proxyConfig() egress.Config {
	return egress.Config{Presets: c.Presets, DNS: c.DNS, LogPath: c.Log,
		Limits:        egress.Limits{Conns: c.Limits.Conns, BytesPerSecond: c.Limits.BytesPerSecond, TotalBytes: c.Limits.TotalBytes},
		HeaderTimeout: time.Duration(c.HeaderTimeoutS) * time.Second, DialTimeout: time.Duration(c.DialTimeoutS) * time.Second}
}

// openProxy loads the configuration at path and starts the proxy; the
// egress log's directory is made (0711, as the state directory) when
// missing. The caller closes the proxy.
func openProxy(path, stateDir string) (*egress.Proxy, egressConfig, error) {
	c, err := loadEgressConfig(path, stateDir)
	if err != nil {
		return nil, c, err
	}
	if err := os.MkdirAll(filepath.Dir(c.Log), 0o711); err != nil {
		return nil, c, fmt.Errorf("egress log directory: %w", err)
	}
	p, err := egress.New(c.proxyConfig())
	if err != nil {
		return nil, c, fmt.Errorf("egress proxy: %w", err)
	}
	return p, c, nil
}

// presetNames are the names a computer's policy may use.
func (c egressConfig) presetNames() []string {
	names := make([]string, 0, len(c.Presets))
	for _, p := range c.Presets {
		names = append(names, p.Name)
	}
	return names
}

// proxyStats reads one computer's counters from p, for the metrics.
func proxyStats(p *egress.Proxy) func(string) (metrics.EgressStats, bool) {
	return func(id string) (metrics.EgressStats, bool) {
		s, ok := p.Stats(id)
		return metrics.EgressStats{Open: s.Open, BytesUp: s.BytesUp, BytesDown: s.BytesDown, Refused: s.Refused}, ok
	}
}
