package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ErrUnknownPreset is wrapped by Compile when a policy names a preset the
// operator's configuration does not hold.
var ErrUnknownPreset = errors.New("egress policy names an unknown preset")

// Compiled is one policy merged with the presets it names, ready to
// match connections. It is immutable and safe for concurrent use.
type Compiled struct {
	allow, deny []compiledRule
	// Lifted are the AllowCIDRs of the presets the policy names: the
	// special ranges the proxy may reach for this policy.
	Lifted []netip.Prefix
	// AllowNoSNI is the policy's, or any named preset's, AllowNoSNI.
	AllowNoSNI bool
}

type compiledRule struct {
	label string // for the egress log: `allow host pypi.org` or `preset p: deny cidr ...`
	host  string // exact name, or the suffix (".github.com") when wild
	wild  bool
	pfx   netip.Prefix // valid for a CIDR rule
	ports []uint16
}

// Compile validates p, merges the presets it names (from presets, the
// operator's configuration) and returns the result. An unknown preset
// name fails with ErrUnknownPreset.
func Compile(p Policy, presets []Preset) (*Compiled, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c := &Compiled{AllowNoSNI: p.AllowNoSNI}
	c.allow = compileRules("", "allow", p.Allow)
	c.deny = compileRules("", "deny", p.Deny)
	for _, name := range p.Presets {
		i := slices.IndexFunc(presets, func(ps Preset) bool { return ps.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("%w: %q", ErrUnknownPreset, name)
		}
		ps := presets[i]
		if err := ps.Validate(); err != nil {
			return nil, err
		}
		c.allow = append(c.allow, compileRules(name, "allow", ps.Allow)...)
		c.deny = append(c.deny, compileRules(name, "deny", ps.Deny)...)
		for _, s := range ps.AllowCIDRs {
			c.Lifted = append(c.Lifted, netip.MustParsePrefix(s).Masked())
		}
		c.AllowNoSNI = c.AllowNoSNI || ps.AllowNoSNI
	}
	return c, nil
}

// compileRules turns validated rules into their matching form.
func compileRules(preset, verb string, rules []Rule) []compiledRule {
	out := make([]compiledRule, 0, len(rules))
	for _, r := range rules {
		cr := compiledRule{ports: r.Ports}
		if len(cr.ports) == 0 {
			cr.ports = DefaultPorts
		}
		if r.CIDR != "" {
			cr.pfx = netip.MustParsePrefix(r.CIDR)
			cr.label = verb + " cidr " + r.CIDR
		} else {
			cr.label = verb + " host " + r.Host
			cr.host, cr.wild = r.Host, strings.HasPrefix(r.Host, "*.")
			if cr.wild {
				cr.host = r.Host[1:]
			}
		}
		if preset != "" {
			cr.label = "preset " + preset + ": " + cr.label
		}
		out = append(out, cr)
	}
	return out
}

// Decision is the policy's verdict on one destination.
type Decision struct {
	Allowed bool
	// Rule is the label of the rule that decided: the deny rule that
	// matched, or the allow rule that admitted; empty when none matched.
	Rule string
}

// Match decides a connection to name (lower case, no trailing dot; empty
// for an address literal) on port, whose resolved addresses are addrs.
// Deny wins: a host deny rule matching name, or a CIDR deny rule
// containing any address, refuses. An allow rule admits if it is a host
// rule matching name, or a CIDR rule containing every address.
func (c *Compiled) Match(name string, port uint16, addrs []netip.Addr) Decision {
	for _, r := range c.deny {
		if r.matches(name, port, addrs, false) {
			return Decision{Rule: r.label}
		}
	}
	for _, r := range c.allow {
		if r.matches(name, port, addrs, true) {
			return Decision{Allowed: true, Rule: r.label}
		}
	}
	return Decision{}
}

func (r compiledRule) matches(name string, port uint16, addrs []netip.Addr, all bool) bool {
	if !slices.Contains(r.ports, port) {
		return false
	}
	if !r.pfx.IsValid() {
		if r.wild {
			return name != "" && strings.HasSuffix(name, r.host)
		}
		return name != "" && name == r.host
	}
	if len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if r.pfx.Contains(a.Unmap()) != all {
			return !all
		}
	}
	return all
}

// MayAllowName reports whether some allow rule could admit name on port
// before it is resolved: a host rule that matches it (and no host deny
// rule that does), or any CIDR allow rule on that port. The proxy does
// not resolve a name for which it is false, so a computer cannot send
// queries for names its policy never allows (DNS exfiltration).
func (c *Compiled) MayAllowName(name string, port uint16) bool {
	for _, r := range c.deny {
		if !r.pfx.IsValid() && r.matches(name, port, nil, false) {
			return false
		}
	}
	for _, r := range c.allow {
		if r.pfx.IsValid() && slices.Contains(r.ports, port) || !r.pfx.IsValid() && r.matches(name, port, nil, true) {
			return true
		}
	}
	return false
}
