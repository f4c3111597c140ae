package custodian

import (
	"fmt"

	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/jail"
)

// Outcomes of the agent record.
const (
	AgentJailed   = "jailed"
	AgentUnjailed = "unjailed"
	// CodeNoJail marks an agent started unconfined on the operator's
	// explicit request (--no-jail).
	CodeNoJail = "no_jail"
	// CodeNetworkHost marks a jailed agent that shares the host's
	// network (jail.network "host": it reaches every service on the
	// host's loopback), whether the operator chose it or no endpoint was
	// known to default to "proxy".
	CodeNetworkHost = "network_host"
)

// AgentStart describes the start of the agent process, for the audit log.
// It carries digests only, never argv or paths in clear.
type AgentStart struct {
	TupleSHA256 string
	Principal   string
	// Jailed is false only when the operator opted out (--no-jail).
	Jailed bool
	// JailSHA256 is the digest of the jail's resolved spec (views, exec
	// allowlist, ids, network); empty when unjailed.
	JailSHA256 string
	// ArgvSHA256 is the digest of the agent's command line.
	ArgvSHA256 string
	// Network is the jail's network mode (jail.NetworkHost, ...); the
	// jail's digest covers it, and its egress policy under "proxy".
	Network string
}

// RecordAgentStart appends the agent record before the agent starts. An
// error means the audit log cannot record it, and the agent must not be
// started: nothing runs unaudited.
func (c *Custodian) RecordAgentStart(a AgentStart) error {
	r := audit.Record{Kind: audit.KindAgent, TupleSHA256: a.TupleSHA256, Principal: a.Principal,
		Outcome: AgentJailed, Digests: map[string]string{"argv": a.ArgvSHA256, "jail": a.JailSHA256}}
	switch {
	case !a.Jailed:
		r.Outcome, r.Code = AgentUnjailed, CodeNoJail
		delete(r.Digests, "jail")
	case a.Network == jail.NetworkHost:
		r.Code = CodeNetworkHost
	}
	if _, err := c.alog.Append(r); err != nil {
		return fmt.Errorf("audit: record the agent's start: %w", err)
	}
	return nil
}
