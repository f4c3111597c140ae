// Package addrcheck decides which addresses the egress proxy may connect
// to, and reads a host as curl and the C library would: a name, or an IP
// literal in any of the forms inet_aton(3) and RFC 4291 accept (decimal
// "2130706433", octal "0177.0.0.1", hex "0x7f.1", "::ffff:127.0.0.1").
// A literal that looks numeric but does not parse is refused as
// malformed, never sent to DNS. It imports only the standard library.
package addrcheck

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ErrMalformed is wrapped by ParseHost for a host that is neither a
// valid name nor a valid IP literal.
var ErrMalformed = errors.New("malformed host")

// Host is a parsed destination host: either a name (lower case, no
// trailing dot) to resolve, or an address literal.
type Host struct {
	Name string     // set for a name
	Addr netip.Addr // set (valid) for a literal
}

// IsLiteral reports whether the host was an IP literal.
func (h Host) IsLiteral() bool { return h.Addr.IsValid() }

// String is the name, or the literal in its canonical form.
func (h Host) String() string {
	if h.IsLiteral() {
		return h.Addr.String()
	}
	return h.Name
}

// ParseHost reads host (without port; an IPv6 literal may keep its
// brackets) as curl would. Names are lowered and lose one trailing dot.
func ParseHost(host string) (Host, error) {
	if host == "" || len(host) > 253+2 {
		return Host{}, fmt.Errorf("%w: %q: empty or too long", ErrMalformed, host)
	}
	if strings.HasPrefix(host, "[") || strings.Contains(host, ":") {
		return parseV6(host)
	}
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if endsInNumber(h) {
		a, err := ParseIPv4Loose(h)
		if err != nil {
			return Host{}, err
		}
		return Host{Addr: a}, nil
	}
	if err := validName(h); err != nil {
		return Host{}, err
	}
	return Host{Name: h}, nil
}

func parseV6(host string) (Host, error) {
	s, ok := strings.CutPrefix(host, "[")
	if ok {
		if s, ok = strings.CutSuffix(s, "]"); !ok {
			return Host{}, fmt.Errorf("%w: %q: unclosed bracket", ErrMalformed, host)
		}
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() {
		return Host{}, fmt.Errorf("%w: %q: not an IPv6 literal", ErrMalformed, host)
	}
	if a.Zone() != "" {
		return Host{}, fmt.Errorf("%w: %q: an IPv6 zone is refused", ErrMalformed, host)
	}
	return Host{Addr: a}, nil
}

// endsInNumber is the WHATWG URL rule: a host whose last label is a
// number (decimal, or 0x hex) is an IPv4 literal, or malformed.
func endsInNumber(h string) bool {
	last := h[strings.LastIndexByte(h, '.')+1:]
	if last == "" {
		return false
	}
	if rest, ok := strings.CutPrefix(last, "0x"); ok {
		return onlyDigits(rest, 16)
	}
	return onlyDigits(last, 10)
}

func onlyDigits(s string, base int) bool {
	for i := 0; i < len(s); i++ {
		if digit(s[i], base) < 0 {
			return false
		}
	}
	return true
}

func digit(c byte, base int) int {
	v := -1
	switch {
	case c >= '0' && c <= '9':
		v = int(c - '0')
	case c >= 'a' && c <= 'f':
		v = int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		v = int(c-'A') + 10
	}
	if v >= base {
		return -1
	}
	return v
}

// ParseIPv4Loose parses the inet_aton(3) forms: one to four parts, each
// decimal, octal (leading 0) or hex (0x); the last part fills the bytes
// the others leave (a.b.c.d, a.b.c16, a.b24, a32).
func ParseIPv4Loose(s string) (netip.Addr, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, fmt.Errorf("%w: %q: more than four parts", ErrMalformed, s)
	}
	var v uint64
	for i, p := range parts {
		n, err := parsePart(p)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%w: %q: part %d: %v", ErrMalformed, s, i+1, err)
		}
		if i < len(parts)-1 {
			if n > 255 {
				return netip.Addr{}, fmt.Errorf("%w: %q: part %d over 255", ErrMalformed, s, i+1)
			}
			v |= n << (8 * (3 - i))
			continue
		}
		if n >= 1<<(8*(4-i)) {
			return netip.Addr{}, fmt.Errorf("%w: %q: last part too large", ErrMalformed, s)
		}
		v |= n
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), nil
}

func parsePart(p string) (uint64, error) {
	base := 10
	switch {
	case p == "":
		return 0, errors.New("empty")
	case strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X"):
		base, p = 16, p[2:]
		if p == "" {
			return 0, errors.New("0x without digits")
		}
	case len(p) > 1 && p[0] == '0':
		base, p = 8, p[1:]
	}
	if len(p) > 12 || !onlyDigits(p, base) {
		return 0, fmt.Errorf("not a base-%d number", base)
	}
	return strconv.ParseUint(p, base, 64)
}

// validName checks a DNS name's presentation form loosely: labels of 1
// to 63 bytes of letters, digits, hyphens and underscores.
func validName(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("%w: name %q: empty or too long", ErrMalformed, h)
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("%w: name %q: empty or long label", ErrMalformed, h)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%w: name %q has %q", ErrMalformed, h, c)
			}
		}
	}
	return nil
}
