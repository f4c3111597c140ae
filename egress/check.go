package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/tetherdev/tether/egress/addrcheck"
	"github.com/tetherdev/tether/egress/policy"
)

// check decides a destination under the computer's current policy: the
// host is parsed as curl would, a name is resolved once (all A and AAAA)
// only if some rule could allow it, every address is checked against
// the special ranges, then the policy decides.
func (c *computer) check(ctx context.Context, host string, port uint16) (*dest, *refusal) {
	pol := c.pol.Load()
	h, err := addrcheck.ParseHost(host)
	if err != nil {
		return nil, &refusal{check: policy.CheckProtocol, reason: err.Error()}
	}
	d := &dest{host: h, port: port, pol: pol}
	if h.IsLiteral() {
		d.addrs = []netip.Addr{h.Addr}
	} else {
		if !pol.MayAllowName(h.Name, port) {
			return nil, &refusal{check: policy.CheckPolicy, reason: fmt.Sprintf(
				"no allow rule of the computer's egress policy matches %s (not resolved)", hostPort(h.Name, port))}
		}
		if d.addrs, err = c.resolve(ctx, h.Name); err != nil {
			return nil, &refusal{check: policy.CheckResolve, reason: err.Error()}
		}
	}
	if r := c.allowed(pol, d); r != nil {
		return nil, r
	}
	d.rule = pol.Match(h.Name, port, d.addrs).Rule
	return d, nil
}

// allowed checks d's addresses and policy match under pol.
func (c *computer) allowed(pol *policy.Compiled, d *dest) *refusal {
	checker := addrcheck.Checker{Lifted: pol.Lifted, Host: c.p.cfg.HostAddrs}
	for _, a := range d.addrs {
		if r := checker.Check(a); r != nil {
			return &refusal{check: policy.CheckSpecialAddress, reason: specialReason(d, r), addr: a}
		}
	}
	dec := pol.Match(d.host.Name, d.port, d.addrs)
	if dec.Allowed {
		return nil
	}
	what := hostPort(d.host.String(), d.port)
	if dec.Rule != "" {
		return &refusal{check: policy.CheckPolicy, reason: fmt.Sprintf("%s is refused by the rule %q", what, dec.Rule)}
	}
	return &refusal{check: policy.CheckPolicy, reason: "no allow rule of the computer's egress policy matches " + what}
}

// specialReason says why d was refused for one of its addresses. For a
// name it does not say which address: the reason reaches the computer
// (the 403, its refusal file), and an internal name's private address
// would make the proxy an oracle of the host's DNS. The egress log and
// the callback's Refusal.Addr keep the address.
func specialReason(d *dest, r *addrcheck.Refused) string {
	switch {
	case d.host.IsLiteral():
		return r.Error()
	case len(d.addrs) == 1:
		return fmt.Sprintf("%s resolves to an address that is %s; the proxy refuses it", d.host.Name, r.Range)
	}
	return fmt.Sprintf("%s resolves to %d addresses and one of them is %s; the proxy refuses the name",
		d.host.Name, len(d.addrs), r.Range)
}

// errNoAddress is wrapped when a name has no A or AAAA record.
var errNoAddress = errors.New("no address")

// resolve asks the configured DNS server for name's A and AAAA records,
// once. The name is sent fully qualified, so no search domain applies.
func (c *computer) resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, c.p.cfg.DialTimeout)
	defer cancel()
	addrs, err := c.p.resolver.LookupNetIP(ctx, "ip", name+".")
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, fmt.Errorf("%s does not resolve (%w)", name, errNoAddress)
		}
		if errors.As(err, &de) {
			// DNSError's text, and the socket error inside it, name the
			// host's DNS server; the reason reaches the computer.
			what := "the DNS server could not be reached"
			switch {
			case de.IsTimeout:
				what = "the DNS server did not answer in time"
			case de.Err == "server misbehaving":
				what = "the DNS server failed (server misbehaving)"
			}
			return nil, fmt.Errorf("resolving %s: %s", name, what)
		}
		return nil, fmt.Errorf("resolving %s: %v", name, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s has no A or AAAA record (%w)", name, errNoAddress)
	}
	for i, a := range addrs {
		addrs[i] = a.WithZone("")
	}
	return slices.Compact(addrs), nil
}

// dial connects to one of d's checked addresses, in the order resolved,
// and records which; it never resolves again.
func (c *computer) dial(ctx context.Context, s *session, d *dest) (net.Conn, error) {
	var errs []error
	for _, a := range d.addrs {
		conn, err := c.p.dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a.Unmap(), d.port).String())
		if err == nil {
			s.mu.Lock()
			d.addr = a
			s.mu.Unlock()
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("connecting to %s: %w", hostPort(d.host.String(), d.port), errors.Join(errs...))
}
