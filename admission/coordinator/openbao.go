package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/openbao/openbao/api/v2"
)

// Lease is the outcome of one renewal.
type Lease struct {
	// Expiry is when the renewed lease ends, measured from the moment the
	// request was sent (so never later than OpenBao's own view).
	Expiry time.Time
	// Duration is the TTL OpenBao granted.
	Duration time.Duration
}

// Renewer renews the lease that backs the grants. OpenBaoRenewer is the
// real one.
type Renewer interface {
	Renew(ctx context.Context) (Lease, error)
}

// ErrNoLeaseTTL: the renewal succeeded but granted no TTL, so it cannot
// bound any grant.
var ErrNoLeaseTTL = errors.New("renewal granted no TTL")

// OpenBaoRenewer renews a token (auth/token/renew-self) or a lease
// (sys/leases/renew) with github.com/openbao/openbao/api/v2. It reads no
// environment variable: everything comes from OpenBaoConfig.
type OpenBaoRenewer struct {
	cfg    OpenBaoConfig
	client *api.Client
	now    func() time.Time
}

var _ Renewer = (*OpenBaoRenewer)(nil)

// NewOpenBaoRenewer validates cfg and builds the client. now is the clock
// (nil means time.Now).
func NewOpenBaoRenewer(cfg OpenBaoConfig, now func() time.Time) (*OpenBaoRenewer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ac := api.NewConfig() // unlike DefaultConfig, reads no BAO_* variables
	if ac.Error != nil {
		return nil, fmt.Errorf("openbao client: %w", ac.Error)
	}
	ac.Address = cfg.Address
	ac.Timeout = 10 * time.Second
	if cfg.TimeoutS > 0 {
		ac.Timeout = time.Duration(cfg.TimeoutS) * time.Second
	}
	if cfg.MaxRetries != nil {
		ac.MaxRetries = *cfg.MaxRetries
	}
	if cfg.CACert != "" {
		if err := ac.ConfigureTLS(&api.TLSConfig{CACert: cfg.CACert}); err != nil {
			return nil, fmt.Errorf("%w: openbao.ca_cert: %w", ErrConfig, err)
		}
	}
	client, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("openbao client: %w", err)
	}
	client.ClearToken()
	if now == nil {
		now = time.Now
	}
	return &OpenBaoRenewer{cfg: cfg, client: client, now: now}, nil
}

// Renew renews the configured token or lease by the configured increment
// and returns when it now ends.
func (r *OpenBaoRenewer) Renew(ctx context.Context) (Lease, error) {
	tok, err := readToken(r.cfg.TokenFile)
	if err != nil {
		return Lease{}, err
	}
	c, err := r.client.Clone()
	if err != nil {
		return Lease{}, err
	}
	c.SetToken(tok)
	sent := r.now()
	ttl, err := r.renew(ctx, c)
	if err != nil {
		return Lease{}, err
	}
	if ttl <= 0 {
		return Lease{}, fmt.Errorf("%w (mode %s)", ErrNoLeaseTTL, r.cfg.Renew)
	}
	d := time.Duration(ttl) * time.Second
	return Lease{Expiry: sent.Add(d), Duration: d}, nil
}

// renew calls the configured endpoint and returns the TTL in seconds.
func (r *OpenBaoRenewer) renew(ctx context.Context, c *api.Client) (int, error) {
	inc := int(r.cfg.IncrementS)
	if r.cfg.Renew == RenewLease {
		s, err := c.Sys().RenewWithContext(ctx, r.cfg.LeaseID, inc)
		if err != nil {
			return 0, fmt.Errorf("sys/leases/renew %s: %w", r.cfg.LeaseID, err)
		}
		if s == nil {
			return 0, errors.New("sys/leases/renew: empty response")
		}
		if s.LeaseID != "" && s.LeaseID != r.cfg.LeaseID {
			return 0, fmt.Errorf("sys/leases/renew: response names lease %q, not %q", s.LeaseID, r.cfg.LeaseID)
		}
		return s.LeaseDuration, nil
	}
	s, err := c.Auth().Token().RenewSelfWithContext(ctx, inc)
	if err != nil {
		return 0, fmt.Errorf("auth/token/renew-self: %w", err)
	}
	if s == nil || s.Auth == nil {
		return 0, errors.New("auth/token/renew-self: response has no auth block")
	}
	return s.Auth.LeaseDuration, nil
}
