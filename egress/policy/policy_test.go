package policy

import (
	"errors"
	"testing"
)

func TestValidateAcceptsTheForms(t *testing.T) {
	p := Policy{
		Allow: []Rule{
			{Host: "pypi.org"},
			{Host: "*.github.com", Ports: []uint16{443}},
			{CIDR: "203.0.113.0/24"},
			{CIDR: "2001:db8::/32", Ports: []uint16{22}},
		},
		Deny:    []Rule{{Host: "evil.github.com"}},
		Presets: []string{"pypi", "internal_mirror-1"},
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if err := (Policy{}).Validate(); err != nil {
		t.Fatalf("the zero policy (deny all): %v", err)
	}
}

func TestValidateRefusesMalformedRules(t *testing.T) {
	bad := map[string]Rule{
		"empty":            {},
		"both":             {Host: "a.b", CIDR: "10.0.0.0/8"},
		"port 0":           {Host: "a.b", Ports: []uint16{0}},
		"bad cidr":         {CIDR: "10.0.0.0/33"},
		"unmasked cidr":    {CIDR: "10.0.0.1/8"},
		"ip literal":       {Host: "127.0.0.1"},
		"ipv6 literal":     {Host: "::1"},
		"upper case":       {Host: "PyPI.org"},
		"trailing dot":     {Host: "pypi.org."},
		"bare wildcard":    {Host: "*.com"},
		"inner wildcard":   {Host: "a.*.com"},
		"hyphen edge":      {Host: "-a.com"},
		"empty label":      {Host: "a..com"},
		"underscore":       {Host: "a_b.com"},
		"long label":       {Host: string(make([]byte, 64)) + ".com"},
		"only star prefix": {Host: "*."},
	}
	for name, r := range bad {
		err := Policy{Allow: []Rule{r}}.Validate()
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate(%+v) = %v, want ErrInvalid", name, r, err)
		}
	}
}

func TestValidateBoundsSizes(t *testing.T) {
	many := make([]Rule, MaxRules+1)
	for i := range many {
		many[i] = Rule{Host: "a.b"}
	}
	if err := (Policy{Allow: many}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("%d rules: %v, want ErrInvalid", len(many), err)
	}
	ports := make([]uint16, MaxPorts+1)
	for i := range ports {
		ports[i] = uint16(i + 1)
	}
	if err := (Policy{Allow: []Rule{{Host: "a.b", Ports: ports}}}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("%d ports: %v, want ErrInvalid", len(ports), err)
	}
	if err := (Policy{Presets: []string{"Bad Name"}}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("preset name with space and capitals: %v, want ErrInvalid", err)
	}
}

func TestPresetValidate(t *testing.T) {
	ok := Preset{Name: "mirror", Allow: []Rule{{Host: "mirror.internal"}}, AllowCIDRs: []string{"10.20.0.0/16"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	bad := Preset{Name: "mirror", AllowCIDRs: []string{"10.20.0.0/99"}}
	if err := bad.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad allow_cidrs: %v, want ErrInvalid", err)
	}
}

func FuzzValidHostPattern(f *testing.F) {
	for _, s := range []string{"pypi.org", "*.github.com", "*.com", "127.0.0.1", "a..b", "xn--bcher-kva.example"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		if ValidHostPattern(h) != nil {
			return
		}
		// An accepted pattern is lower case ASCII, short, and not an address.
		if len(h) > MaxHostLen {
			t.Fatalf("accepted %d bytes", len(h))
		}
		for i := 0; i < len(h); i++ {
			if c := h[i]; c >= 'A' && c <= 'Z' || c > 0x7f {
				t.Fatalf("accepted %q with %q", h, c)
			}
		}
	})
}
