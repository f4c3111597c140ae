package custodian

import (
	"context"
	"sort"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// KillTerminal serves terminal/kill: the receiver signals the child's
// whole process group. Keyed, so a retry is answered from its receipt;
// a SIGKILL repeated on the same group changes nothing, so the key spends
// no durable write (keyed.idempotent).
func (h *client) KillTerminal(ctx context.Context, p acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodTerminalKill, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.KillTerminalResponse{}, err
	}
	if _, err := cl.terminalOf(p.TerminalId); err != nil {
		return acp.KillTerminalResponse{}, err
	}
	raw, err := cl.keyed(ctx, cl.control(wire.OpExecKill, p.TerminalId, acp.KillTerminalResponse{}, audit.KindCancel))
	return decodeResponse[acp.KillTerminalResponse](raw, err)
}

// ReleaseTerminal serves terminal/release: the receiver kills the group if
// it still runs and forgets the terminal. Keyed without a durable write
// (releasing a released terminal changes nothing). The exec's receipt
// then records the exit the custodian observed, or, if it never observed
// one, failed.
func (h *client) ReleaseTerminal(ctx context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodTerminalRelease, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.ReleaseTerminalResponse{}, err
	}
	t, err := cl.terminalOf(p.TerminalId)
	if err != nil {
		return acp.ReleaseTerminalResponse{}, err
	}
	raw, err := cl.keyed(ctx, cl.control(wire.OpExecRelease, p.TerminalId, acp.ReleaseTerminalResponse{}, ""))
	if err == nil {
		cl.b.dropTerminal(p.TerminalId)
		cl.c.recordRelease(t)
	}
	return decodeResponse[acp.ReleaseTerminalResponse](raw, err)
}

// control is the keyed request of kill and release.
func (cl *call) control(op wire.Op, id string, resp any, kind audit.Kind) keyed {
	return keyed{op: op, args: &wire.TerminalArgs{TerminalID: id}, result: &wire.Empty{}, idempotent: true,
		settle: func() (any, *opstore.Receipt) {
			if kind != "" {
				rec := cl.record(kind)
				cl.c.audit(rec)
			}
			return resp, &opstore.Receipt{Outcome: opstore.NeedsReview, TerminalID: id}
		}}
}

// kill signals a child's group because the agent cancelled; it is not
// keyed (killing twice is harmless) and runs even though the agent's
// request context has ended.
func (cl *call) kill(id, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	rec := cl.record(audit.KindCancel)
	conn, err := cl.b.Receiver.onEpoch(cl.epoch)
	if err == nil {
		dl, _ := ctx.Deadline()
		err = conn.Call(ctx, wire.OpExecKill, cl.b.digest, newKey("cancel"), dl, &wire.TerminalArgs{TerminalID: id}, nil)
	}
	if err != nil {
		code, _ := codeMessage(err)
		rec.Code = string(code)
		cl.c.log.Warn("kill after cancel failed", "session", cl.b.sessionID, "terminal", id, "why", why, "err", err)
	}
	cl.c.audit(rec)
}

// execOutcome: verified when the child exited 0 and every expected file
// matched; needs_review for exit 0 with nothing to verify; failed
// otherwise.
func execOutcome(exit wire.ExitStatus, expect, got map[string]string) (opstore.Outcome, []opstore.FileCheck) {
	paths := make([]string, 0, len(expect))
	for p := range expect {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	checks := make([]opstore.FileCheck, 0, len(paths))
	allMatch := true
	for _, p := range paths {
		checks = append(checks, opstore.FileCheck{Path: p, Expected: expect[p], Actual: got[p]})
		allMatch = allMatch && got[p] == expect[p]
	}
	switch {
	case exit.ExitCode == nil || *exit.ExitCode != 0:
		return opstore.Failed, checks
	case len(paths) == 0:
		return opstore.NeedsReview, nil
	case allMatch:
		return opstore.Verified, checks
	}
	return opstore.Failed, checks
}
