package custodian

import (
	"context"
	"sort"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// KillTerminal serves terminal/kill: the receiver signals the child's
// whole process group. Keyed, so a retry is answered from its receipt;
// a SIGKILL repeated on the same group changes nothing, so the key spends
// no durable write (keyed.idempotent). A kill after the child exited is
// forwarded and acknowledged by the receiver; a kill of a terminal this
// session released (or is releasing: the release kills it) is answered
// without error and sends nothing, as other ACP clients answer it, and
// its receipt and audit record say so.
func (h *client) KillTerminal(ctx context.Context, p acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodTerminalKill, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.KillTerminalResponse{}, err
	}
	t, err := cl.knownTerminal(p.TerminalId)
	if err != nil {
		return acp.KillTerminalResponse{}, err
	}
	t.rel.order.RLock() // a release claimed after this check waits until the kill is answered
	defer t.rel.order.RUnlock()
	notSent := ""
	if released, inFlight := t.releaseState(); released || inFlight {
		notSent = noteAlreadyReleased
	} else if t.releasedRemotely() {
		notSent = noteReleasedAtWait
	}
	raw, err := cl.keyed(ctx, cl.control(t, wire.OpExecKill, p.TerminalId, acp.KillTerminalResponse{}, audit.KindCancel, notSent))
	return decodeResponse[acp.KillTerminalResponse](raw, err)
}

// noteAlreadyReleased is the receipt note of a kill or release answered
// without sending anything, because this session released the terminal.
const noteAlreadyReleased = "the terminal was already released by this session; nothing was sent"

// noteReleasedAtWait is the receipt note of a kill or release answered
// without sending anything, because the command had ended and the
// receiver forgot its terminal with the final wait that answered its exit
// and output (docs/custodian.md "Terminals").
const noteReleasedAtWait = "the command had ended and the receiver released its terminal with the final wait; nothing was sent"

// ReleaseTerminal serves terminal/release: the receiver kills the group if
// it still runs and forgets the terminal. Keyed without a durable write
// (releasing a released terminal changes nothing). The exec's receipt
// then records the exit the custodian observed, or, if it never observed
// one, failed. One release of a terminal is sent at a time: a second one
// waits for the first, and after a success it is answered without error
// and sends nothing (recorded as such), as other ACP clients answer it.
func (h *client) ReleaseTerminal(ctx context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodTerminalRelease, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.ReleaseTerminalResponse{}, err
	}
	t, err := cl.knownTerminal(p.TerminalId)
	if err != nil {
		return acp.ReleaseTerminalResponse{}, err
	}
	first, err := cl.claimRelease(ctx, t)
	if err != nil {
		return acp.ReleaseTerminalResponse{}, err
	}
	if !first {
		return decodeResponse[acp.ReleaseTerminalResponse](cl.keyed(ctx,
			cl.control(t, wire.OpExecRelease, p.TerminalId, acp.ReleaseTerminalResponse{}, "", noteAlreadyReleased)))
	}
	notSent := ""
	if t.releasedRemotely() {
		notSent = noteReleasedAtWait
	}
	t.rel.order.Lock() // kills already past their check are answered first
	raw, err := cl.keyed(ctx, cl.control(t, wire.OpExecRelease, p.TerminalId, acp.ReleaseTerminalResponse{}, "", notSent))
	t.rel.order.Unlock()
	if err == nil {
		cl.b.markReleased(p.TerminalId)
		cl.c.recordRelease(t)
	}
	t.endRelease(err == nil)
	return decodeResponse[acp.ReleaseTerminalResponse](raw, err)
}

// claimRelease returns true when this call is to send t's release, false
// when t is released already (waiting first for a release in flight).
func (cl *call) claimRelease(ctx context.Context, t *terminal) (bool, error) {
	for {
		first, released, inFlight := t.beginRelease()
		if first || released {
			return first, nil
		}
		select {
		case <-inFlight:
		case <-ctx.Done():
			return false, acp.NewRequestCancelled(nil)
		case <-time.After(time.Until(cl.Deadline)):
			return false, acperr.NewError(errcode.CodeTimeout, "a release of this terminal was still in flight at the deadline")
		}
	}
}

// noteGoneAtWait is the receipt note of a kill or release the receiver
// answered not_found because a releasing wait in flight had just made it
// forget the terminal: the command had ended, so the request is answered
// without error, as if it had arrived after that wait's answer.
const noteGoneAtWait = "sent while the command's final wait was in flight; that wait had already released the terminal (receiver: not_found), so the command had ended"

// control is the keyed request of kill and release on t; notSent answers
// it without sending anything (keyed.notSent).
func (cl *call) control(t *terminal, op wire.Op, id string, resp any, kind audit.Kind, notSent string) keyed {
	args, note := &wire.TerminalArgs{TerminalID: id}, notSent
	idle, waiting := t.releasingWaitIdle() // before the request: a wait that ends meanwhile still counts
	return keyed{op: op, args: args, result: &wire.Empty{}, idempotent: true, notSent: notSent,
		send: func(ctx context.Context, conn ReceiverConn) error {
			if !waiting {
				return conn.CallFenced(ctx, op, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline, args, &wire.Empty{})
			}
			gone, err := cl.sendRacingWait(ctx, conn, t, idle, op, args)
			if gone {
				note = noteGoneAtWait
			}
			return err
		},
		settle: func() (any, *opstore.Receipt) {
			if kind != "" && note == "" {
				cl.c.audit(cl.record(kind))
			}
			return resp, &opstore.Receipt{Outcome: opstore.NeedsReview, TerminalID: id, Note: note}
		}}
}

// sendRacingWait sends a kill or release of t while a releasing wait was
// in flight (idle closes when it ends). Racing the command's final wait is
// legitimate (an agent that cancels a wait also kills): when the receiver
// answers not_found, it waits for that wait's answer (bounded by ctx) and,
// if the wait released the terminal, reports gone with no error.
func (cl *call) sendRacingWait(ctx context.Context, conn ReceiverConn, t *terminal, idle <-chan struct{}, op wire.Op, args *wire.TerminalArgs) (gone bool, err error) {
	err = conn.CallFenced(ctx, op, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline, args, &wire.Empty{})
	if goneAtWait(ctx, idle, err) && t.releasedRemotely() {
		return true, nil
	}
	return false, err
}

// goneAtWait reports whether err is the receiver's not_found for a
// terminal whose releasing wait was in flight (idle closes when it ends),
// once that wait has ended (bounded by ctx): the caller then checks what
// the wait's answer kept.
func goneAtWait(ctx context.Context, idle <-chan struct{}, err error) bool {
	if code, _ := acperr.CodeOf(err); code != errcode.CodeNotFound {
		return false
	}
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}

// kill signals a child's group because the agent cancelled; it is not
// keyed (killing twice is harmless) and runs even though the agent's
// request context has ended.
func (cl *call) kill(id, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	rec := cl.record(audit.KindCancel)
	conn, err := cl.b.Receiver.onEpoch(cl.Epoch)
	if err == nil {
		dl, _ := ctx.Deadline()
		err = conn.CallFenced(ctx, wire.OpExecKill, cl.b.Digest, newKey("cancel"), cl.b.FenceToken(), dl, &wire.TerminalArgs{TerminalID: id}, nil)
	}
	if err != nil {
		code, _ := codeMessage(err)
		rec.Code = string(code)
		cl.c.log.Warn("kill after cancel failed", "session", cl.b.ID, "terminal", id, "why", why, "err", err)
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
