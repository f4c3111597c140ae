// Package egress is the host's one egress proxy: it serves every
// computer, each on a listener that lives in the computer's own network
// namespace (so the listener names the computer), speaks HTTP forward,
// CONNECT and SOCKS5 on one port, resolves every name itself, checks
// every address and the computer's policy, connects to the address it
// checked, and records every connection in a hash-chained log.
// docs/egress.md describes what it checks.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/egresslog"
	"github.com/tetherdev/tether/egress/policy"
)

// Sentinels callers branch on.
var (
	ErrAttached = errors.New("egress: computer already attached")
	ErrUnknown  = errors.New("egress: unknown computer")
	ErrClosed   = errors.New("egress: proxy closed")
)

var _ api.Egress = (*Proxy)(nil)

// Proxy is the egress proxy. Its methods are safe for concurrent use.
type Proxy struct {
	cfg      Config
	log      *egresslog.Log
	resolver *net.Resolver
	dialer   net.Dialer

	mu        sync.Mutex
	computers map[string]*computer
	closed    bool
}

// New opens the egress log and returns a proxy serving no computer yet.
// The caller closes it.
func New(cfg Config) (*Proxy, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.HostAddrs == nil {
		if cfg.HostAddrs, err = interfaceAddrs(); err != nil {
			return nil, err
		}
	}
	log, err := egresslog.Open(cfg.LogPath)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: log, computers: map[string]*computer{}}
	p.dialer = net.Dialer{Timeout: cfg.DialTimeout}
	p.resolver = &net.Resolver{PreferGo: true}
	if cfg.DNS != "" {
		p.resolver.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return p.dialer.DialContext(ctx, network, cfg.DNS)
		}
	}
	return p, nil
}

func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("egress: the host's addresses: %w", err)
	}
	out := []netip.Addr{}
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, pfx.Addr().WithZone(""))
		}
	}
	return out, nil
}

// Attach starts serving computer id on ln under pol (see api.Egress).
// The proxy owns ln from then on and closes it on Detach or Close; when
// Attach fails, ln is not taken and the caller closes it.
func (p *Proxy) Attach(ctx context.Context, id string, pol policy.Policy, ln net.Listener, refused func(policy.Refusal)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	compiled, err := policy.Compile(pol, p.cfg.Presets)
	if err != nil {
		return fmt.Errorf("egress: attach %s: %w", id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return ErrClosed
	case p.computers[id] != nil:
		return fmt.Errorf("%w: %s", ErrAttached, id)
	}
	c := newComputer(p, id, ln, compiled, refused)
	p.computers[id] = c
	c.start()
	return nil
}

// SetPolicy replaces id's policy: new connections see it at once, and
// open connections it no longer allows are closed before it returns.
func (p *Proxy) SetPolicy(ctx context.Context, id string, pol policy.Policy) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	compiled, err := policy.Compile(pol, p.cfg.Presets)
	if err != nil {
		return fmt.Errorf("egress: set policy of %s: %w", id, err)
	}
	c := p.computer(id)
	if c == nil {
		return fmt.Errorf("%w: %s", ErrUnknown, id)
	}
	c.setPolicy(compiled)
	return nil
}

// Detach stops serving id: its listener and every open connection are
// closed, and its refusal callback has returned, before Detach returns.
func (p *Proxy) Detach(ctx context.Context, id string) error {
	p.mu.Lock()
	c := p.computers[id]
	delete(p.computers, id)
	p.mu.Unlock()
	if c != nil {
		c.stop()
	}
	return ctx.Err()
}

// Close detaches every computer and closes the egress log. Safe twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	cs := p.computers
	p.computers = map[string]*computer{}
	p.closed = true
	p.mu.Unlock()
	for _, c := range cs {
		c.stop()
	}
	return p.log.Close()
}

// Stats are one computer's counters, for metrics.
type Stats struct {
	Open      int64 // connections open now
	BytesUp   int64 // computer to destinations, since Attach
	BytesDown int64 // destinations to computer
	Refused   int64 // connections refused
	// RefusalsDropped counts refusals not handed to the callback because
	// it fell behind (they are still in the egress log).
	RefusalsDropped int64
}

// Stats returns id's counters; ok is false for an unknown id.
func (p *Proxy) Stats(id string) (s Stats, ok bool) {
	c := p.computer(id)
	if c == nil {
		return Stats{}, false
	}
	return c.stats(), true
}

// LogHead is the egress log's current head, to keep beside the log so
// that a truncation shows (egresslog.Verify).
func (p *Proxy) LogHead() egresslog.Head { return p.log.Head() }

func (p *Proxy) computer(id string) *computer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.computers[id]
}
