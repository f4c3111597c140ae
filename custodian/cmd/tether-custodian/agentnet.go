package main

import (
	"fmt"
	"net/netip"

	"github.com/tetherdev/tether/custodian/agentprofile"
	"github.com/tetherdev/tether/custodian/jail"
	"github.com/tetherdev/tether/egress/policy"
)

// endpointPreset names the preset agentNetwork makes when the agent's
// endpoint is an address: only a preset may lift the proxy's refusal of
// loopback and private ranges (a model server on the host's loopback, a
// gateway on the LAN), and it lifts that one address alone.
const endpointPreset = "agent-endpoint"

// agentNetwork settles the jail's network (docs/custodian.md, "The
// agent's network"):
//
//   - jail.network set: kept; under "proxy" without jail.egress, the
//     profile's endpoint is the policy;
//   - unset, the profile knows the agent's endpoint and this custodian
//     has the egress proxy: "proxy", allowing that endpoint alone;
//   - unset otherwise: "host", as before (audited, code network_host).
//
// It returns the presets the proxy must know (the endpoint's, when it is
// an address).
func agentNetwork(cfg jail.Config, p *agentprofile.Profile, env []string, haveProxy bool) (jail.Config, []policy.Preset, error) {
	var ep agentprofile.Target
	known := false
	if p != nil {
		var err error
		if ep, known, err = p.EndpointIn(env); err != nil {
			return cfg, nil, fmt.Errorf("%w: %w", jail.ErrConfig, err)
		}
	}
	switch {
	case cfg.Network == "" && known && haveProxy:
		cfg.Network = jail.NetworkProxy
	case cfg.Network == "":
		cfg.Network = jail.NetworkHost
	}
	if cfg.Network != jail.NetworkProxy || cfg.Egress != nil || !known {
		return cfg, nil, cfg.Validate()
	}
	pol, presets := endpointPolicy(ep)
	cfg.Egress = &pol
	return cfg, presets, cfg.Validate()
}

// endpointPolicy allows the endpoint alone: a name by a host rule, an
// address by a CIDR rule of that address, with a preset lifting it. A
// plain-http endpoint also allows tunnels without TLS (AllowNoSNI): an
// agent's HTTP client tunnels even plain HTTP through CONNECT (Claude
// Code does), and the only place the policy lets a tunnel go is the
// endpoint.
func endpointPolicy(ep agentprofile.Target) (policy.Policy, []policy.Preset) {
	ports := []uint16{ep.Port}
	addr, err := netip.ParseAddr(ep.Host)
	if err != nil {
		return policy.Policy{Allow: []policy.Rule{{Host: ep.Host, Ports: ports}}, AllowNoSNI: ep.Plain}, nil
	}
	one := netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen()).String()
	rule := policy.Rule{CIDR: one, Ports: ports}
	preset := policy.Preset{Name: endpointPreset, Allow: []policy.Rule{rule}, AllowCIDRs: []string{one}}
	return policy.Policy{Allow: []policy.Rule{rule}, Presets: []string{endpointPreset}, AllowNoSNI: ep.Plain}, []policy.Preset{preset}
}
