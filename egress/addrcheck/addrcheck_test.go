package addrcheck

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestParseHostLiterals: every IP literal form curl and inet_aton accept
// is read as the address they would connect to.
func TestParseHostLiterals(t *testing.T) {
	cases := map[string]string{
		"2130706433":              "127.0.0.1",
		"0x7f.1":                  "127.0.0.1",
		"0x7F000001":              "127.0.0.1",
		"0177.0.0.1":              "127.0.0.1",
		"017700000001":            "127.0.0.1",
		"127.1":                   "127.0.0.1",
		"127.0.1":                 "127.0.0.1",
		"127.0.0.1.":              "127.0.0.1",
		"169.254.43518":           "169.254.169.254",
		"0xa9fea9fe":              "169.254.169.254",
		"0":                       "0.0.0.0",
		"[::1]":                   "::1",
		"::1":                     "::1",
		"::ffff:127.0.0.1":        "::ffff:127.0.0.1",
		"[0:0:0:0:0:ffff:7f00:1]": "::ffff:127.0.0.1",
		"[64:ff9b::7f00:1]":       "64:ff9b::7f00:1",
		"8.8.8.8":                 "8.8.8.8",
	}
	for in, want := range cases {
		h, err := ParseHost(in)
		if err != nil {
			t.Errorf("ParseHost(%q): %v", in, err)
			continue
		}
		if !h.IsLiteral() || h.Addr.String() != want {
			t.Errorf("ParseHost(%q) = %+v, want literal %s", in, h, want)
		}
	}
}

// TestParseHostRefusesMalformed: a host that looks numeric but is not a
// valid literal is refused, never resolved as a name.
func TestParseHostRefusesMalformed(t *testing.T) {
	for _, in := range []string{"256.0.0.1", "1.2.3.4.5", "08.0.0.1", "0x", "0x.1", "1..2", "4294967296",
		"127.0.0.256", "1.2.65536", "[::1", "fe80::1%eth0", "[1.2.3.4]", "exa mple.com", "", "a..b", "12345678901234567890",
		strings.Repeat("a", 64) + ".com"} {
		if h, err := ParseHost(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseHost(%q) = %+v, %v; want ErrMalformed", in, h, err)
		}
	}
	for in, want := range map[string]string{"PyPI.org.": "pypi.org", "0x7f.example": "0x7f.example", "1.2.3.4.com": "1.2.3.4.com"} {
		h, err := ParseHost(in)
		if err != nil || h.IsLiteral() || h.Name != want {
			t.Errorf("ParseHost(%q) = %+v, %v; want name %q", in, h, err, want)
		}
	}
}

// TestCheckRefusesSpecial: each special range is refused, and lifting
// it (the positive control) lets the same address through.
func TestCheckRefusesSpecial(t *testing.T) {
	refused := []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
		"0.0.0.0", "224.0.0.1", "255.255.255.255", "240.0.0.1", "::", "::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
		"::127.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::1", "2002:7f00:1::1", "2002:a9fe:a9fe::1",
		"fd00::1", "fe80::1", "ff02::1", "2001:db8::1", "2001::1", "100::1", "4000::1"}
	for _, s := range refused {
		a := netip.MustParseAddr(s)
		if r := (Checker{}).Check(a); r == nil {
			t.Errorf("Check(%s) passed, want refused", s)
		}
		lifted := Checker{Lifted: []netip.Prefix{netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())}}
		if r := lifted.Check(a); r != nil {
			t.Errorf("Check(%s) with its range lifted: %v", s, r)
		}
	}
	for _, s := range []string{"8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"} {
		if r := (Checker{}).Check(netip.MustParseAddr(s)); r != nil {
			t.Errorf("Check(%s): %v, want allowed", s, r)
		}
	}
	own := netip.MustParseAddr("198.41.0.4")
	if r := (Checker{Host: []netip.Addr{own}}).Check(own); r == nil {
		t.Error("the host's own address passed")
	}
}

// FuzzParseHost: ParseHost never panics, and a literal it returns is
// the address its canonical form parses to again.
func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"2130706433", "0x7f.1", "[::1]", "::ffff:127.0.0.1", "pypi.org", "0177.1", "1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseHost(s)
		if err != nil {
			return
		}
		again, err := ParseHost(h.String())
		if err != nil || again != h {
			t.Fatalf("ParseHost(%q) = %+v, but its form %q parses to %+v, %v", s, h, h.String(), again, err)
		}
		_ = (Checker{}).Check(h.Addr)
	})
}
