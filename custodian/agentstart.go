package custodian

import (
	"fmt"

	"github.com/tetherdev/tether/custodian/audit"
)

// Outcomes of the agent record.
const (
	AgentJailed   = "jailed"
	AgentUnjailed = "unjailed"
	// CodeNoJail marks an agent started unconfined on the operator's
	// explicit request (--no-jail).
	CodeNoJail = "no_jail"
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
}

// RecordAgentStart appends the agent record before the agent starts. An
// error means the audit log cannot record it, and the agent must not be
// started: nothing runs unaudited.
func (c *Custodian) RecordAgentStart(a AgentStart) error {
	r := audit.Record{Kind: audit.KindAgent, TupleSHA256: a.TupleSHA256, Principal: a.Principal,
		Outcome: AgentJailed, Digests: map[string]string{"argv": a.ArgvSHA256, "jail": a.JailSHA256}}
	if !a.Jailed {
		r.Outcome, r.Code = AgentUnjailed, CodeNoJail
		delete(r.Digests, "jail")
	}
	if _, err := c.alog.Append(r); err != nil {
		return fmt.Errorf("audit: record the agent's start: %w", err)
	}
	return nil
}
