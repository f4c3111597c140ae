package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

func (b *memBackend) Egress(_ context.Context, c api.Caller, id string) (api.EgressInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.find(c, id); err != nil {
		return api.EgressInfo{}, err
	}
	return api.EgressInfo{Computer: id, Policy: b.egress[id], Enabled: true, Attached: true}, nil
}

// SetEgress stores pol; the operator has one preset, "pypi".
func (b *memBackend) SetEgress(ctx context.Context, c api.Caller, id string, pol policy.Policy) (api.EgressInfo, error) {
	for _, p := range pol.Presets {
		if p != "pypi" {
			return api.EgressInfo{}, api.Errorf(api.CodeUnknownPreset, "no preset %q", p)
		}
	}
	b.mu.Lock()
	if b.egress == nil {
		b.egress = map[string]policy.Policy{}
	}
	b.egress[id] = pol
	b.mu.Unlock()
	return b.Egress(ctx, c, id)
}

// TestParseRule: hosts, wildcards, IPv4 and IPv6 prefixes, with and
// without ports; malformed rules are refused.
func TestParseRule(t *testing.T) {
	good := map[string]policy.Rule{
		"pypi.org":              {Host: "pypi.org"},
		"*.github.com:443":      {Host: "*.github.com", Ports: []uint16{443}},
		"files.example:80,8080": {Host: "files.example", Ports: []uint16{80, 8080}},
		"203.0.113.0/24":        {CIDR: "203.0.113.0/24"},
		"203.0.113.0/24:5432":   {CIDR: "203.0.113.0/24", Ports: []uint16{5432}},
		"2001:db8::/32":         {CIDR: "2001:db8::/32"},
		"2001:db8::/32:22,443":  {CIDR: "2001:db8::/32", Ports: []uint16{22, 443}},
	}
	for in, want := range good {
		got, err := parseRule(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseRule(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "pypi.org:", "pypi.org:0", "pypi.org:65536", "pypi.org:http", "127.0.0.1",
		"10.0.0.1/8", "*.com", "PyPI.org", "a.example:80:443"} {
		if r, err := parseRule(in); err == nil {
			t.Errorf("parseRule(%q) = %+v, want an error", in, r)
		}
	}
}

// TestEgressCommands: create takes a policy from flags or a file, egress
// set replaces it and egress show prints it; an unknown preset fails with
// its code, a malformed rule and mixed flags are usage errors.
func TestEgressCommands(t *testing.T) {
	_, sock := serveMem(t)
	code, out, errs := cmd(t, "create", "--socket", sock, "--egress-allow", "pypi.org", "--egress-allow", "*.pythonhosted.org:443",
		"--egress-deny", "203.0.113.0/24", "--egress-preset", "pypi", "--field", "id")
	if code != 0 {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	id := strings.TrimSpace(out)
	code, out, errs = cmd(t, "egress", "show", id, "--socket", sock)
	if code != 0 || !strings.Contains(out, `"computer": "`+id+`"`) || !strings.Contains(out, `"attached": true`) {
		t.Fatalf("egress show: %d %q %q", code, out, errs)
	}
	file := filepath.Join(t.TempDir(), "policy.json")
	want := policy.Policy{Allow: []policy.Rule{{Host: "github.com", Ports: []uint16{443}}}, AllowNoSNI: true}
	b, _ := json.Marshal(want)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = cmd(t, "egress", "set", id, "--egress", file, "--socket", sock)
	var info api.EgressInfo
	if code != 0 || json.Unmarshal([]byte(out), &info) != nil || !reflect.DeepEqual(info.Policy, want) {
		t.Fatalf("egress set --egress FILE: %d %q %q", code, out, errs)
	}
	code, out, errs = cmd(t, "egress", "set", id, "--socket", sock)
	info = api.EgressInfo{}
	if code != 0 || json.Unmarshal([]byte(out), &info) != nil || !reflect.DeepEqual(info.Policy, policy.Policy{}) {
		t.Fatalf("egress set with no rule (deny all): %d %q %q", code, out, errs)
	}
	if code, _, errs := cmd(t, "egress", "set", id, "--egress-preset", "nonesuch", "--socket", sock); code != exitFail ||
		!strings.Contains(errs, api.CodeUnknownPreset) {
		t.Errorf("unknown preset: exit %d %q, want 1 naming %s", code, errs, api.CodeUnknownPreset)
	}
	for _, args := range [][]string{
		{"egress", "set", id, "--egress-allow", "127.0.0.1"},
		{"egress", "set", id, "--egress", file, "--egress-allow", "pypi.org"},
		{"create", "--egress-deny", "pypi.org:0"},
		{"egress", "nonesuch"},
	} {
		if code, _, _ := cmd(t, append(args, "--socket", sock)...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
	bad := filepath.Join(t.TempDir(), "dup.json")
	os.WriteFile(bad, []byte(`{"allow":[],"allow":[{"host":"evil.example"}]}`), 0o600)
	if code, _, errs := cmd(t, "egress", "set", id, "--egress", bad, "--socket", sock); code != exitUsage ||
		!strings.Contains(errs, "dup.json") {
		t.Errorf("a policy file with a duplicate key: exit %d %q, want a usage error", code, errs)
	}
}

// FuzzParseRule: whatever the flag value, parseRule never panics, and a
// rule it accepts is valid, has exactly one of host and cidr, and only
// ports 1 to 65535. Seeds in testdata/fuzz/FuzzParseRule.
func FuzzParseRule(f *testing.F) {
	f.Add("files.example:80,8080")
	f.Add("203.0.113.0/24:5432")
	f.Fuzz(func(t *testing.T, v string) {
		r, err := parseRule(v)
		if err != nil {
			return
		}
		if r.Validate() != nil || (r.Host == "") == (r.CIDR == "") {
			t.Fatalf("accepted %q as %+v", v, r)
		}
		for _, p := range r.Ports {
			if p == 0 {
				t.Fatalf("accepted port 0 from %q", v)
			}
		}
	})
}
