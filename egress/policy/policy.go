// Package policy is the egress policy of one computer: which names,
// addresses and ports its connections may reach through the host's egress
// proxy. It is the contract the computer service (which stores a policy
// per computer and takes changes through its API), the proxy (egress,
// which enforces it) and the custodian's agent jail share. It is a leaf:
// it imports only the standard library.
//
// The default policy, the zero Policy, denies everything. Deny rules win
// over allow rules. A rule never lifts the proxy's refusal of special
// address ranges (loopback, private, link-local, CGNAT, ULA, multicast,
// unspecified); only an operator's preset can, with AllowCIDRs.
package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Bounds on a policy, so that a request body cannot make the proxy's
// matching arbitrarily slow.
const (
	MaxRules     = 256 // allow plus deny rules of one policy
	MaxPresets   = 16  // preset names one policy may name
	MaxPorts     = 32  // ports of one rule
	MaxHostLen   = 253 // a DNS name's longest presentation form
	MaxPresetLen = 64
)

// DefaultPorts are the ports a rule admits when it names none.
var DefaultPorts = []uint16{80, 443}

// Policy is one computer's egress policy. The zero Policy denies all.
type Policy struct {
	// Allow lists what the computer may reach.
	Allow []Rule `json:"allow,omitempty"`
	// Deny lists what it may not reach, even where an allow rule or a
	// preset matches.
	Deny []Rule `json:"deny,omitempty"`
	// Presets names operator presets (Preset.Name) whose rules are added
	// to this policy's own. An unknown name is refused where the policy
	// is set.
	Presets []string `json:"presets,omitempty"`
	// AllowNoSNI lets a CONNECT tunnel carry a TLS ClientHello without a
	// server name (or a non-TLS stream). Off by default: the proxy
	// requires the SNI to equal the CONNECT host.
	AllowNoSNI bool `json:"allow_no_sni,omitempty"`
}

// Rule matches a destination. Exactly one of Host and CIDR is set.
type Rule struct {
	// Host is an exact DNS name ("pypi.org") or a suffix pattern
	// ("*.github.com", which matches names below github.com, not
	// github.com itself). Compared in lower case, without a trailing dot.
	Host string `json:"host,omitempty"`
	// CIDR is an address prefix ("203.0.113.0/24"); it matches a
	// connection whose checked address lies in it.
	CIDR string `json:"cidr,omitempty"`
	// Ports the rule admits; empty means DefaultPorts.
	Ports []uint16 `json:"ports,omitempty"`
}

// Preset is a named set of rules an operator writes in the egress
// configuration. Only a preset may lift the refusal of special address
// ranges, with AllowCIDRs (for an internal mirror).
type Preset struct {
	Name       string   `json:"name"`
	Allow      []Rule   `json:"allow,omitempty"`
	Deny       []Rule   `json:"deny,omitempty"`
	AllowCIDRs []string `json:"allow_cidrs,omitempty"`
	AllowNoSNI bool     `json:"allow_no_sni,omitempty"`
}

// ErrInvalid is wrapped by every Validate failure.
var ErrInvalid = errors.New("egress policy invalid")

// Validate checks the policy's form (not its preset names, which only
// the proxy's configuration knows). The error names the failed check.
func (p Policy) Validate() error {
	if n := len(p.Allow) + len(p.Deny); n > MaxRules {
		return fmt.Errorf("%w: %d rules, at most %d", ErrInvalid, n, MaxRules)
	}
	if len(p.Presets) > MaxPresets {
		return fmt.Errorf("%w: %d presets, at most %d", ErrInvalid, len(p.Presets), MaxPresets)
	}
	for i, r := range p.Allow {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("allow[%d]: %w", i, err)
		}
	}
	for i, r := range p.Deny {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("deny[%d]: %w", i, err)
		}
	}
	for i, name := range p.Presets {
		if err := validPresetName(name); err != nil {
			return fmt.Errorf("presets[%d]: %w", i, err)
		}
	}
	return nil
}

// Validate checks a preset's name, rules and lifted ranges.
func (p Preset) Validate() error {
	if err := validPresetName(p.Name); err != nil {
		return err
	}
	pol := Policy{Allow: p.Allow, Deny: p.Deny}
	if err := pol.Validate(); err != nil {
		return fmt.Errorf("preset %q: %w", p.Name, err)
	}
	for i, c := range p.AllowCIDRs {
		if _, err := netip.ParsePrefix(c); err != nil {
			return fmt.Errorf("preset %q: allow_cidrs[%d]: %w: %v", p.Name, i, ErrInvalid, err)
		}
	}
	return nil
}

// Validate checks one rule's form.
func (r Rule) Validate() error {
	switch {
	case r.Host == "" && r.CIDR == "":
		return fmt.Errorf("%w: a rule needs host or cidr", ErrInvalid)
	case r.Host != "" && r.CIDR != "":
		return fmt.Errorf("%w: a rule has host or cidr, not both", ErrInvalid)
	}
	if len(r.Ports) > MaxPorts {
		return fmt.Errorf("%w: %d ports, at most %d", ErrInvalid, len(r.Ports), MaxPorts)
	}
	for _, port := range r.Ports {
		if port == 0 {
			return fmt.Errorf("%w: port 0", ErrInvalid)
		}
	}
	if r.CIDR != "" {
		pfx, err := netip.ParsePrefix(r.CIDR)
		if err != nil {
			return fmt.Errorf("%w: cidr %q: %v", ErrInvalid, r.CIDR, err)
		}
		if pfx != pfx.Masked() {
			return fmt.Errorf("%w: cidr %q has bits set past its length (want %s)", ErrInvalid, r.CIDR, pfx.Masked())
		}
		return nil
	}
	return ValidHostPattern(r.Host)
}

// ValidHostPattern checks an exact name or a "*.suffix" pattern: lower
// case letters, digits, hyphens and dots, labels of 1 to 63 bytes, no
// leading or trailing hyphen, no trailing dot, and at least two labels
// under a wildcard (no "*.com"). An IP literal is not a host pattern: use
// a CIDR rule.
func ValidHostPattern(h string) error {
	name, wild := strings.CutPrefix(h, "*.")
	if len(h) > MaxHostLen || name == "" {
		return fmt.Errorf("%w: host %q: empty or longer than %d bytes", ErrInvalid, h, MaxHostLen)
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return fmt.Errorf("%w: host %q is an address; use a cidr rule", ErrInvalid, h)
	}
	labels := strings.Split(name, ".")
	if wild && len(labels) < 2 {
		return fmt.Errorf("%w: host %q: a wildcard needs a suffix of two labels or more", ErrInvalid, h)
	}
	for _, l := range labels {
		if err := validLabel(l); err != nil {
			return fmt.Errorf("%w: host %q: %v", ErrInvalid, h, err)
		}
	}
	return nil
}

func validLabel(l string) error {
	if l == "" || len(l) > 63 {
		return errors.New("a label is empty or longer than 63 bytes")
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("label %q starts or ends with a hyphen", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("label %q has %q (lower case letters, digits and hyphens only)", l, c)
		}
	}
	return nil
}

func validPresetName(name string) error {
	if name == "" || len(name) > MaxPresetLen {
		return fmt.Errorf("%w: preset name %q: empty or longer than %d bytes", ErrInvalid, name, MaxPresetLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%w: preset name %q has %q", ErrInvalid, name, c)
		}
	}
	return nil
}

// Refusal is what the proxy reports about one connection it refused, so
// that the computer (and its owner) can see what was refused and why.
type Refusal struct {
	Time time.Time `json:"time"`
	// Host is the name or address literal the client asked for.
	Host string `json:"host"`
	Port uint16 `json:"port"`
	// Addr is the resolved address that failed a check, if one did.
	Addr string `json:"addr,omitempty"`
	// Check names the failed check, one of the Check constants.
	Check string `json:"check"`
	// Reason says it in words, for a person reading a failed pip install.
	Reason string `json:"reason"`
}

// The checks a Refusal names.
const (
	CheckPolicy         = "policy"          // no allow rule matches, or a deny rule does
	CheckSpecialAddress = "special_address" // a resolved address lies in a refused range
	CheckResolve        = "resolve"         // the name did not resolve
	CheckSNI            = "sni"             // the ClientHello's server name differs from the CONNECT host
	CheckHostHeader     = "host_header"     // the absolute URL and the Host header disagree
	CheckLimit          = "limit"           // a per-computer limit (connections, bytes) is reached
	CheckProtocol       = "protocol"        // a malformed request
	CheckPolicyChanged  = "policy_changed"  // an open tunnel closed because the policy no longer allows it
)
