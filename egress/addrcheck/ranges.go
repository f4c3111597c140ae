package addrcheck

import (
	"fmt"
	"net/netip"
)

// special is one refused range and what it is, for the refusal's reason.
type special struct {
	pfx  netip.Prefix
	what string
}

func mustPrefix(s, what string) special { return special{netip.MustParsePrefix(s), what} }

// v4Special are the IPv4 ranges that are not globally reachable (the IANA
// special-purpose registry's global=false rows, and multicast).
var v4Special = []special{
	mustPrefix("0.0.0.0/8", "unspecified (this network)"),
	mustPrefix("10.0.0.0/8", "private"),
	mustPrefix("100.64.0.0/10", "shared address space (CGNAT)"),
	mustPrefix("127.0.0.0/8", "loopback"),
	mustPrefix("169.254.0.0/16", "link-local (cloud metadata lives at 169.254.169.254)"),
	mustPrefix("172.16.0.0/12", "private"),
	mustPrefix("192.0.0.0/24", "IETF protocol assignments"),
	mustPrefix("192.0.2.0/24", "documentation"),
	mustPrefix("192.88.99.0/24", "6to4 relay anycast"),
	mustPrefix("192.168.0.0/16", "private"),
	mustPrefix("198.18.0.0/15", "benchmarking"),
	mustPrefix("198.51.100.0/24", "documentation"),
	mustPrefix("203.0.113.0/24", "documentation"),
	mustPrefix("224.0.0.0/4", "multicast"),
	mustPrefix("240.0.0.0/4", "reserved (and broadcast)"),
}

// v6Special are refused outright; v6Embed embed an IPv4 address that is
// checked in turn. Anything outside 2000::/3 and the NAT64 prefix is not
// global unicast and is refused too.
var (
	v6Special = []special{
		mustPrefix("::/128", "unspecified"),
		mustPrefix("::1/128", "loopback"),
		mustPrefix("::/96", "IPv4-compatible"),
		mustPrefix("64:ff9b:1::/48", "local-use NAT64"),
		mustPrefix("100::/64", "discard-only"),
		mustPrefix("2001::/23", "IETF protocol assignments (Teredo and others)"),
		mustPrefix("2001:db8::/32", "documentation"),
		mustPrefix("3fff::/20", "documentation"),
		mustPrefix("fc00::/7", "unique local (ULA)"),
		mustPrefix("fe80::/10", "link-local"),
		mustPrefix("fec0::/10", "site-local"),
		mustPrefix("ff00::/8", "multicast"),
	}
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	global6   = netip.MustParsePrefix("2000::/3")
)

// Refused says why an address may not be reached.
type Refused struct {
	Addr netip.Addr
	What string // the range, in words, naming an embedded IPv4 address
	// Range is the range's name without any address ("private"), for a
	// reason that must not disclose what a name resolved to.
	Range string
}

func (r *Refused) Error() string {
	return fmt.Sprintf("%s is %s, which the proxy refuses", r.Addr, r.What)
}

// Checker refuses special addresses except those an operator lifted.
// The zero Checker refuses every special range and lifts nothing.
type Checker struct {
	// Lifted are ranges an operator's preset allows (AllowCIDRs). An
	// address inside one is not refused; an IPv4-mapped IPv6 address is
	// checked as the IPv4 address it reaches.
	Lifted []netip.Prefix
	// Host are the host's own addresses; they are refused like loopback.
	Host []netip.Addr
}

// Check returns nil if addr may be reached, else a *Refused.
func (c Checker) Check(addr netip.Addr) *Refused {
	if addr.Is4In6() {
		if r := c.Check(addr.Unmap()); r != nil {
			return &Refused{addr, "the IPv4-mapped form of " + r.Addr.String() + ", " + r.What, r.Range}
		}
		return nil
	}
	addr = addr.WithZone("")
	for _, p := range c.Lifted {
		if p.Contains(addr) {
			return nil
		}
	}
	var r *Refused
	if addr.Is4() {
		r = check4(addr)
	} else {
		r = c.check6(addr)
	}
	if r != nil {
		return r
	}
	for _, h := range c.Host {
		if h.WithZone("") == addr {
			return &Refused{addr, "one of the proxy host's own addresses", "one of the proxy host's own addresses"}
		}
	}
	return nil
}

func check4(addr netip.Addr) *Refused {
	if addr == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return &Refused{addr, "broadcast", "broadcast"}
	}
	for _, s := range v4Special {
		if s.pfx.Contains(addr) {
			return &Refused{addr, s.what, s.what}
		}
	}
	return nil
}

func (c Checker) check6(addr netip.Addr) *Refused {
	for _, s := range v6Special {
		if s.pfx.Contains(addr) {
			return &Refused{addr, s.what, s.what}
		}
	}
	b := addr.As16()
	var embedded netip.Addr
	switch {
	case nat64.Contains(addr):
		embedded = netip.AddrFrom4([4]byte(b[12:16]))
	case sixToFour.Contains(addr):
		embedded = netip.AddrFrom4([4]byte(b[2:6]))
	case !global6.Contains(addr):
		return &Refused{addr, "not global unicast (outside 2000::/3)", "not global unicast (outside 2000::/3)"}
	default:
		return nil
	}
	if r := c.Check(embedded); r != nil {
		return &Refused{addr, fmt.Sprintf("a NAT64 or 6to4 form of %s, %s", embedded, r.What), "a NAT64 or 6to4 form of an address that is " + r.Range}
	}
	return nil
}
