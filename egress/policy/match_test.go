package policy

import (
	"errors"
	"net/netip"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestMatchDenyWinsPresetsMerge: allow by exact host, suffix and CIDR on
// default or named ports; deny wins, also from a preset.
func TestMatchDenyWinsPresetsMerge(t *testing.T) {
	presets := []Preset{{Name: "mirror", Allow: []Rule{{Host: "mirror.example"}}, Deny: []Rule{{Host: "bad.github.com"}},
		AllowCIDRs: []string{"10.0.0.0/8"}}}
	p := Policy{
		Allow:   []Rule{{Host: "pypi.org"}, {Host: "*.github.com"}, {CIDR: "203.0.113.0/24", Ports: []uint16{8080}}},
		Deny:    []Rule{{CIDR: "203.0.113.66/32", Ports: []uint16{443, 8080}}},
		Presets: []string{"mirror"},
	}
	c, err := Compile(p, presets)
	if err != nil {
		t.Fatal(err)
	}
	pub := addrs("8.8.8.8")
	cases := []struct {
		name  string
		port  uint16
		addrs []netip.Addr
		want  bool
	}{
		{"pypi.org", 443, pub, true},
		{"pypi.org", 80, pub, true},
		{"pypi.org", 22, pub, false},
		{"files.pypi.org", 443, pub, false},
		{"api.github.com", 443, pub, true},
		{"github.com", 443, pub, false},
		{"bad.github.com", 443, pub, false},
		{"mirror.example", 443, pub, true},
		{"", 8080, addrs("203.0.113.5"), true},
		{"", 8080, addrs("203.0.113.5", "8.8.8.8"), false},
		{"x.example", 8080, addrs("203.0.113.5", "203.0.113.66"), false},
		{"", 443, addrs("203.0.113.5"), false},
		{"pypi.org", 443, addrs("203.0.113.66"), false},
	}
	for _, tc := range cases {
		if d := c.Match(tc.name, tc.port, tc.addrs); d.Allowed != tc.want {
			t.Errorf("Match(%q, %d, %v) = %+v, want allowed=%v", tc.name, tc.port, tc.addrs, d, tc.want)
		}
	}
	if d := c.Match("bad.github.com", 443, pub); d.Rule != "preset mirror: deny host bad.github.com" {
		t.Errorf("deny rule label %q", d.Rule)
	}
	if len(c.Lifted) != 1 || c.Lifted[0].String() != "10.0.0.0/8" {
		t.Errorf("Lifted = %v", c.Lifted)
	}
	if d := (&Compiled{}).Match("pypi.org", 443, pub); d.Allowed {
		t.Error("the zero policy allowed")
	}
}

func TestCompileRefusesUnknownPreset(t *testing.T) {
	if _, err := Compile(Policy{Presets: []string{"nope"}}, nil); !errors.Is(err, ErrUnknownPreset) {
		t.Fatalf("Compile with an unknown preset: %v", err)
	}
	if _, err := Compile(Policy{Presets: []string{"nope"}}, []Preset{{Name: "nope"}}); err != nil {
		t.Fatalf("Compile with the preset configured: %v", err)
	}
}

func TestMayAllowName(t *testing.T) {
	c, err := Compile(Policy{Allow: []Rule{{Host: "*.github.com"}}, Deny: []Rule{{Host: "bad.github.com"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"api.github.com": true, "bad.github.com": false, "exfil.attacker.example": false} {
		if got := c.MayAllowName(name, 443); got != want {
			t.Errorf("MayAllowName(%q) = %v, want %v", name, got, want)
		}
	}
	c, _ = Compile(Policy{Allow: []Rule{{CIDR: "8.8.8.0/24", Ports: []uint16{53}}}}, nil)
	if !c.MayAllowName("any.example", 53) || c.MayAllowName("any.example", 443) {
		t.Error("a CIDR rule must admit resolving any name on its ports only")
	}
}
