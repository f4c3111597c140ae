package main

import (
	"errors"
	"testing"

	"github.com/tetherdev/tether/custodian/agentprofile"
	"github.com/tetherdev/tether/custodian/jail"
	"github.com/tetherdev/tether/egress/policy"
)

// TestAgentNetwork: the jail defaults to network proxy where the
// profile knows the agent's endpoint (and the proxy is there), allowing
// that endpoint alone; an address endpoint comes with a preset lifting
// that one address; a plain-http endpoint allows tunnels without TLS; an explicit jail.network is kept; without a known
// endpoint the default stays host.
func TestAgentNetwork(t *testing.T) {
	cc, _ := agentprofile.Lookup("claude-code")
	plain, _ := agentprofile.Lookup("plain")
	cfg, presets, err := agentNetwork(jail.Config{}, cc, nil, true)
	if err != nil || cfg.Network != jail.NetworkProxy || presets != nil || cfg.Egress.AllowNoSNI ||
		len(cfg.Egress.Allow) != 1 || cfg.Egress.Allow[0].Host != "api.anthropic.com" || cfg.Egress.Allow[0].Ports[0] != 443 {
		t.Fatalf("claude-code by default: %+v %+v %v", cfg, presets, err)
	}
	cfg, presets, err = agentNetwork(jail.Config{}, cc, []string{"ANTHROPIC_BASE_URL=http://127.0.0.1:8080"}, true)
	if err != nil || cfg.Network != jail.NetworkProxy || len(presets) != 1 || presets[0].AllowCIDRs[0] != "127.0.0.1/32" ||
		cfg.Egress.Allow[0].CIDR != "127.0.0.1/32" || cfg.Egress.Allow[0].Ports[0] != 8080 || cfg.Egress.Presets[0] != endpointPreset ||
		!cfg.Egress.AllowNoSNI {
		t.Fatalf("loopback endpoint: %+v %+v %v", cfg, presets, err)
	}
	if err := presets[0].Validate(); err != nil {
		t.Fatalf("the endpoint preset: %v", err)
	}
	if cfg, _, err = agentNetwork(jail.Config{}, cc, nil, false); err != nil || cfg.Network != jail.NetworkHost {
		t.Fatalf("without the proxy: %+v %v, want host", cfg, err)
	}
	if cfg, _, err = agentNetwork(jail.Config{}, plain, nil, true); err != nil || cfg.Network != jail.NetworkHost || cfg.Egress != nil {
		t.Fatalf("plain agent: %+v %v, want host", cfg, err)
	}
	if cfg, _, err = agentNetwork(jail.Config{Network: jail.NetworkHost}, cc, nil, true); err != nil || cfg.Network != jail.NetworkHost {
		t.Fatalf("explicit host: %+v %v", cfg, err)
	}
	own := &policy.Policy{Allow: []policy.Rule{{Host: "gateway.example.com"}}}
	if cfg, _, err = agentNetwork(jail.Config{Network: jail.NetworkProxy, Egress: own}, cc, nil, true); err != nil || cfg.Egress != own {
		t.Fatalf("explicit jail.egress: %+v %v, want kept", cfg, err)
	}
	if _, _, err = agentNetwork(jail.Config{}, cc, []string{"ANTHROPIC_BASE_URL=ftp://x"}, true); !errors.Is(err, jail.ErrConfig) {
		t.Fatalf("bad base URL: %v, want ErrConfig", err)
	}
}
