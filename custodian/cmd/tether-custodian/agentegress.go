package main

import (
	"path/filepath"

	"github.com/tetherdev/tether/custodian/jail"
	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/policy"
)

// AgentEgressLog is the egress log of the agent's proxy, in the state
// directory (hidden from the jail): every connection the agent made or
// was refused, hash-chained (egresslog).
const AgentEgressLog = "agent-egress.log"

func init() { newAgentEgress = startAgentEgress }

// startAgentEgress starts an egress proxy of this run's own for the
// agent's jail: it resolves names through the host's resolv.conf,
// checks every address, knows only presets (the endpoint's), and logs
// to the state directory. close stops it and closes its log.
func startAgentEgress(stateDir string, presets []policy.Preset) (jail.Egress, func() error, error) {
	p, err := egress.New(egress.Config{Presets: presets, LogPath: filepath.Join(stateDir, AgentEgressLog)})
	if err != nil {
		return nil, nil, err
	}
	return p, p.Close, nil
}
