package jail

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tetherdev/tether/egress/policy"
)

// TestBuildNetworkProxy: network proxy needs a proxy, takes the agent's
// policy and port, replaces every inherited proxy variable with the
// jail's own, and enters the jail's digest; jail.egress is refused under
// another mode, and so is an invalid policy or port.
func TestBuildNetworkProxy(t *testing.T) {
	f := newBuildFixture(t)
	pol := &policy.Policy{Allow: []policy.Rule{{Host: "api.anthropic.com"}}}
	o := f.options(Config{Network: NetworkProxy, Egress: pol})
	if _, err := Build(o); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "needs an egress proxy") {
		t.Fatalf("proxy without Egress: %v, want ErrConfig naming the missing proxy", err)
	}
	o.Egress = stubEgress{}
	o.Env = append(o.Env, "HTTPS_PROXY=http://corp:8080", "no_proxy=*", "all_proxy=socks5://x:1")
	s, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if s.EgressPort != DefaultEgressPort || len(s.EgressPolicy.Allow) != 1 || s.EgressPolicy.Allow[0].Host != "api.anthropic.com" {
		t.Fatalf("port %d policy %+v", s.EgressPort, s.EgressPolicy)
	}
	var got []string
	for _, kv := range s.Env {
		if name, _, _ := strings.Cut(kv, "="); slices.Contains(proxyNames, name) {
			got = append(got, kv)
		}
	}
	want := []string{"HTTP_PROXY=http://127.0.0.1:3128", "http_proxy=http://127.0.0.1:3128",
		"HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128",
		"ALL_PROXY=socks5h://127.0.0.1:3128", "all_proxy=socks5h://127.0.0.1:3128", "NO_PROXY=", "no_proxy="}
	if !slices.Equal(got, want) {
		t.Fatalf("proxy variables %q, want %q", got, want)
	}
	if slices.Contains(bwrapArgs(s, "/h", "/t"), "--unshare-net") {
		t.Fatal("bwrap would make a network namespace of its own: the proxy's listener would not be in it")
	}
	other := *pol
	other.Allow = append(other.Allow, policy.Rule{Host: "example.com"})
	o.Config.Egress = &other
	s2, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if s.Digest() == s2.Digest() {
		t.Fatal("the digest does not cover the agent's egress policy")
	}
	host, err := Build(f.options(Config{Network: NetworkHost}))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range host.Env {
		if strings.Contains(kv, "127.0.0.1:3128") {
			t.Fatalf("network host got the jail's proxy variable %s", kv)
		}
	}
	for _, c := range []Config{
		{Network: NetworkHost, Egress: pol},
		{Network: NetworkNone, EgressPort: 8080},
		{Network: NetworkProxy, EgressPort: 70000},
		{Network: NetworkProxy, Egress: &policy.Policy{Allow: []policy.Rule{{Host: "*.com"}}}},
		{Network: "vpn"},
	} {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", c, err)
		}
	}
}

// TestDescribePolicy: the banner names what the agent may reach.
func TestDescribePolicy(t *testing.T) {
	for _, c := range []struct {
		pol  policy.Policy
		want string
	}{
		{policy.Policy{}, "nothing (jail.egress allows nothing)"},
		{policy.Policy{Allow: []policy.Rule{{Host: "api.anthropic.com"}, {CIDR: "203.0.113.0/24", Ports: []uint16{8443}}},
			Deny: []policy.Rule{{Host: "x.example"}}, Presets: []string{"model"}},
			"api.anthropic.com:80,443 203.0.113.0/24:8443 presets model (less 1 deny rules)"},
	} {
		if got := describePolicy(c.pol); got != c.want {
			t.Errorf("describePolicy(%+v) = %q, want %q", c.pol, got, c.want)
		}
	}
}
