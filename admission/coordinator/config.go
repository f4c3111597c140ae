// Package coordinator is the single writer of the admission file: each
// round it renews the real lease in OpenBao first, then publishes the
// configured grants with every not_after capped at the lease's expiry. If
// renewal fails it publishes nothing, and the grants already published run
// out on their own. docs/admission.md lists the endpoints and the policy.
//
// It lives apart from package admission so the receiver, which only reads
// the file, does not link the OpenBao client.
package coordinator

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// ErrConfig is wrapped by every configuration refusal.
var ErrConfig = errors.New("coordinator config")

// Renewal modes.
const (
	RenewToken = "token" // PUT /v1/auth/token/renew-self
	RenewLease = "lease" // PUT /v1/sys/leases/renew
)

// Config is the file `tether-admission coordinate --config` reads (strict
// JSON). Relative paths are relative to the config file's directory.
type Config struct {
	OpenBao   OpenBaoConfig `json:"openbao"`
	Dir       string        `json:"dir"`        // admission directory
	Key       string        `json:"key"`        // private signing key file
	Grants    string        `json:"grants"`     // publish input, re-read every round; generation must be omitted
	IntervalS int64         `json:"interval_s"` // seconds between rounds; keep well below the lease TTL
	// Etcd, when set, elects one leader among the coordinators of this
	// directory; only the leader renews and publishes.
	Etcd *EtcdConfig `json:"etcd,omitempty"`
}

// OpenBaoConfig says how to reach OpenBao and which lease to renew.
type OpenBaoConfig struct {
	// Address is the server URL. It must be https, except on a loopback
	// host (a local OpenBao agent).
	Address string `json:"address"`
	// TokenFile holds the token; it is re-read every round (an agent may
	// rotate it) and refused if group/world-readable or a symlink.
	TokenFile string `json:"token_file"`
	// CACert optionally pins the CA bundle that signs the server
	// certificate; otherwise the system roots are used.
	CACert string `json:"ca_cert,omitempty"`
	// Renew is RenewToken or RenewLease.
	Renew string `json:"renew"`
	// LeaseID is the lease renewed in RenewLease mode.
	LeaseID string `json:"lease_id,omitempty"`
	// IncrementS is the renewal increment requested, in seconds.
	IncrementS int64 `json:"increment_s"`
	// TimeoutS bounds each request (default 10).
	TimeoutS int64 `json:"timeout_s,omitempty"`
	// MaxRetries is the client's retry count on 5xx and connection errors
	// (default 2).
	MaxRetries *int `json:"max_retries,omitempty"`
}

// maxConfigBytes bounds the config and token files.
const maxConfigBytes = 1 << 20

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (Config, error) {
	data, err := readBounded(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var c Config
	if err := strictjson.Decode(data, maxConfigBytes, &c); err != nil {
		return Config{}, fmt.Errorf("%w: %s: %w", ErrConfig, path, err)
	}
	base, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c.resolve(base)
	if c.Etcd != nil {
		c.Etcd.resolve(base)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// resolve makes relative paths relative to base.
func (c *Config) resolve(base string) {
	for _, p := range []*string{&c.Dir, &c.Key, &c.Grants, &c.OpenBao.TokenFile, &c.OpenBao.CACert} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(base, *p)
		}
	}
}

// Interval returns the time between rounds.
func (c Config) Interval() time.Duration { return time.Duration(c.IntervalS) * time.Second }

// Validate reports the first missing or unsafe setting.
func (c Config) Validate() error {
	switch {
	case c.Dir == "" || c.Key == "" || c.Grants == "":
		return fmt.Errorf("%w: dir, key and grants are required", ErrConfig)
	case c.IntervalS <= 0:
		return fmt.Errorf("%w: interval_s must be > 0", ErrConfig)
	case c.OpenBao.IncrementS > 0 && c.IntervalS >= c.OpenBao.IncrementS:
		return fmt.Errorf("%w: interval_s %d must be below increment_s %d, or grants lapse between rounds",
			ErrConfig, c.IntervalS, c.OpenBao.IncrementS)
	}
	if c.Etcd != nil {
		if err := c.Etcd.Validate(); err != nil {
			return err
		}
	}
	return c.OpenBao.Validate()
}

// Validate reports the first missing or unsafe OpenBao setting.
func (o OpenBaoConfig) Validate() error {
	if err := checkAddress(o.Address); err != nil {
		return err
	}
	switch {
	case o.TokenFile == "":
		return fmt.Errorf("%w: openbao.token_file is required", ErrConfig)
	case o.Renew != RenewToken && o.Renew != RenewLease:
		return fmt.Errorf("%w: openbao.renew %q is not %q or %q", ErrConfig, o.Renew, RenewToken, RenewLease)
	case o.Renew == RenewLease && o.LeaseID == "":
		return fmt.Errorf("%w: openbao.lease_id is required when renew is %q", ErrConfig, RenewLease)
	case o.Renew == RenewToken && o.LeaseID != "":
		return fmt.Errorf("%w: openbao.lease_id is only used when renew is %q", ErrConfig, RenewLease)
	case o.IncrementS <= 0:
		return fmt.Errorf("%w: openbao.increment_s must be > 0", ErrConfig)
	case o.TimeoutS < 0 || (o.MaxRetries != nil && *o.MaxRetries < 0):
		return fmt.Errorf("%w: openbao.timeout_s and max_retries must not be negative", ErrConfig)
	}
	return nil
}

// checkAddress requires https, or http to a loopback host only.
func checkAddress(addr string) error {
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%w: openbao.address %q is not a URL", ErrConfig, addr)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		host := u.Hostname()
		if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
		return fmt.Errorf("%w: openbao.address %q: plain http is only allowed to a loopback host", ErrConfig, addr)
	}
	return fmt.Errorf("%w: openbao.address %q: scheme must be https", ErrConfig, addr)
}

// readToken reads the token file, refusing a symlink, a non-regular file
// and any group or world permission.
func readToken(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("token file %s: not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("token file %s: mode %04o: readable or writable by group or others (want 0600)", path, fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes))
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("token file %s: not a single token", path)
	}
	return tok, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxConfigBytes)
	}
	return data, nil
}
