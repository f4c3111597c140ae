package custodian

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/receiver/wire"
)

// A session ends when the client closes it (CloseSession) or when its ACP
// connection ends (the agent exited, or Close). Its terminals are then
// released on the receiver, so nothing it started outlives it there (the
// receiver's own orphan grace covers a custodian that dies instead), its
// refusals are written, and its binding is forgotten.

// endTimeout bounds the releases of one session's end.
const endTimeout = 10 * time.Second

// CloseSession ends session sessionID: it sends session/close to the agent
// (an agent without that method answers method-not-found, which is not an
// error), then releases every terminal the session started and has not
// released, writes its refusals and forgets its binding, so later
// callbacks for it are refused not_admitted. The binding ends whatever the
// agent answered.
func (cn *Conn) CloseSession(ctx context.Context, sessionID string) error {
	b := cn.table.get(sessionID)
	if b == nil {
		return fmt.Errorf("%w: session %q is not bound on this connection", ErrBind, sessionID)
	}
	_, err := cn.acp.CloseSession(ctx, acp.CloseSessionRequest{SessionId: acp.SessionId(sessionID)})
	var re *acp.RequestError
	if errors.As(err, &re) && re.Code == acp.NewMethodNotFound("").Code {
		err = nil
	}
	cn.table.remove(sessionID, b)
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	cn.c.endBinding(ectx, b)
	return err
}

// endAll ends every session of the connection (its ACP connection ended),
// all at once, once.
func (cn *Conn) endAll() {
	cn.endOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
		defer cancel()
		var wg sync.WaitGroup
		for _, b := range cn.table.all() {
			cn.table.remove(b.sessionID, b)
			wg.Go(func() { cn.c.endBinding(ctx, b) })
		}
		wg.Wait()
		cn.unbound.end()
		cn.unboundPerms.end()
	})
}

// endBinding releases b's unreleased terminals, all at once, and writes
// its refusals.
func (c *Custodian) endBinding(ctx context.Context, b *binding) {
	var wg sync.WaitGroup
	for id, t := range b.unreleased() {
		wg.Go(func() { c.releaseAtEnd(ctx, b, id, t) })
	}
	wg.Wait()
	b.endTally()
	b.endFolds()
}

// unreleased returns b's terminals that no release has reached.
func (b *binding) unreleased() map[string]*terminal {
	b.mu.Lock()
	all := make(map[string]*terminal, len(b.terminals))
	for id, t := range b.terminals {
		all[id] = t
	}
	b.mu.Unlock()
	for id, t := range all {
		if released, _ := t.releaseState(); released {
			delete(all, id)
		}
	}
	return all
}

// releaseAtEnd releases terminal id of an ended session on the receiver's
// live connection (a lost link leaves it to the receiver's orphan grace),
// audited as a call the custodian tagged, and completes its receipt as a
// release by the agent would.
func (c *Custodian) releaseAtEnd(ctx context.Context, b *binding, id string, t *terminal) {
	first, _, _ := t.beginRelease()
	if !first { // released, or a release is in flight
		return
	}
	if t.releasedRemotely() { // the receiver forgot it with its final wait
		b.markReleased(id)
		c.recordRelease(t)
		t.endRelease(true)
		return
	}
	t.rel.order.Lock()
	err := c.sendEndRelease(ctx, b, id)
	t.rel.order.Unlock()
	switch code, _ := codeMessage(err); {
	case err == nil:
		b.markReleased(id)
		c.recordRelease(t)
	case code == errcode.CodeNotFound: // gone already: its exit is unknown here
		b.markReleased(id)
		c.recordUnknownAtEnd(t)
		err = nil
	default:
		c.log.Warn("release at session end failed; the receiver's orphan grace or the command's deadline ends it",
			"session", b.sessionID, "terminal", id, "err", err)
	}
	t.endRelease(err == nil)
}

// sendEndRelease sends exec_release for terminal id between a dispatch
// and a result record.
func (c *Custodian) sendEndRelease(ctx context.Context, b *binding, id string) error {
	conn, _, err := b.Receiver.current(ctx, false)
	if err != nil {
		return err
	}
	rec := audit.Record{Kind: audit.KindDispatch, SessionID: b.sessionID, TupleSHA256: b.digest, Principal: b.Principal,
		Method: acp.ClientMethodTerminalRelease, OpKey: newKey("end"), TaggedBy: TaggedByCustodian}
	if err := c.auditDispatch(rec); err != nil {
		return err
	}
	dl, _ := ctx.Deadline()
	err = conn.CallFenced(ctx, wire.OpExecRelease, b.digest, rec.OpKey, b.fenceToken(), dl, &wire.TerminalArgs{TerminalID: id}, nil)
	rec.Kind, rec.Outcome = audit.KindResult, "session_end"
	if err != nil {
		code, _ := codeMessage(err)
		rec.Code = string(code)
	}
	c.audit(rec)
	return err
}

// claimTerminals asks the receiver, on the connection of an attach, for
// each of b's unreleased terminals (exec_output, which changes nothing),
// so the receiver hands them to this connection: after a lost link their
// commands are otherwise killed at the end of the receiver's orphan
// grace. Each ask is audited as a call the custodian made; a terminal the
// receiver no longer knows is left for the agent to find.
func (c *Custodian) claimTerminals(ctx context.Context, b *binding, epoch uint64) {
	ids := b.unreleased()
	if len(ids) == 0 {
		return
	}
	conn, err := b.Receiver.onEpoch(epoch)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.AttachTimeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	for id, t := range ids {
		if t.releasedRemotely() { // the receiver forgot it with its final wait
			continue
		}
		rec := audit.Record{Kind: audit.KindDispatch, SessionID: b.sessionID, TupleSHA256: b.digest, Principal: b.Principal,
			Method: acp.ClientMethodTerminalOutput, OpKey: newKey("claim"), TaggedBy: TaggedByCustodian}
		if c.auditDispatch(rec) != nil {
			return
		}
		err := conn.CallFenced(ctx, wire.OpExecOutput, b.digest, rec.OpKey, b.fenceToken(), dl, &wire.TerminalArgs{TerminalID: id}, &wire.ExecOutputResult{})
		rec.Kind, rec.Outcome = audit.KindResult, "claimed"
		if err != nil {
			code, _ := codeMessage(err)
			rec.Outcome, rec.Code = "", string(code)
		}
		c.audit(rec)
	}
}
