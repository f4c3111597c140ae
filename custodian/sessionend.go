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
	"github.com/tetherdev/tether/custodian/binding"
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
	row := cn.table.Get(sessionID)
	if row == nil {
		return fmt.Errorf("%w: session %q is not bound on this connection", ErrBind, sessionID)
	}
	_, err := cn.acp.CloseSession(ctx, acp.CloseSessionRequest{SessionId: acp.SessionId(sessionID)})
	var re *acp.RequestError
	if errors.As(err, &re) && re.Code == acp.NewMethodNotFound("").Code {
		err = nil
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	b := sessionOf(row)
	cn.table.Release(row, func() { cn.c.releaseTerminals(ectx, b) }, b.endFolds)
	return err
}

// endAll ends every session of the connection (its ACP connection ended),
// all at once, once.
func (cn *Conn) endAll() {
	cn.endOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
		defer cancel()
		cn.table.End(func(s *binding.Session) { cn.c.releaseTerminals(ctx, sessionOf(s)) },
			func(s *binding.Session) { sessionOf(s).endFolds() })
		cn.unboundPerms.end()
	})
}

// releaseTerminals releases b's unreleased terminals, all at once (the
// first step of binding.Table.Release).
func (c *Custodian) releaseTerminals(ctx context.Context, b *session) {
	var wg sync.WaitGroup
	for id, t := range b.unreleased() {
		wg.Go(func() { c.releaseAtEnd(ctx, b, id, t) })
	}
	wg.Wait()
}

// unreleased returns b's terminals that no release has reached.
func (b *session) unreleased() map[string]*terminal {
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
func (c *Custodian) releaseAtEnd(ctx context.Context, b *session, id string, t *terminal) {
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
			"session", b.ID, "terminal", id, "err", err)
	}
	t.endRelease(err == nil)
}

// sendEndRelease sends exec_release for terminal id between a dispatch
// and a result record.
func (c *Custodian) sendEndRelease(ctx context.Context, b *session, id string) error {
	conn, _, err := b.Receiver.current(ctx, false)
	if err != nil {
		return err
	}
	rec := audit.Record{Kind: audit.KindDispatch, SessionID: b.ID, TupleSHA256: b.Digest, Principal: b.Principal,
		Method: acp.ClientMethodTerminalRelease, OpKey: newKey("end"), TaggedBy: TaggedByCustodian}
	if err := c.auditDispatch(rec); err != nil {
		return err
	}
	dl, _ := ctx.Deadline()
	err = conn.CallFenced(ctx, wire.OpExecRelease, b.Digest, rec.OpKey, b.FenceToken(), dl, &wire.TerminalArgs{TerminalID: id}, nil)
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
func (c *Custodian) claimTerminals(ctx context.Context, b *session, epoch uint64) {
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
		rec := audit.Record{Kind: audit.KindDispatch, SessionID: b.ID, TupleSHA256: b.Digest, Principal: b.Principal,
			Method: acp.ClientMethodTerminalOutput, OpKey: newKey("claim"), TaggedBy: TaggedByCustodian}
		if c.auditDispatch(rec) != nil {
			return
		}
		err := conn.CallFenced(ctx, wire.OpExecOutput, b.Digest, rec.OpKey, b.FenceToken(), dl, &wire.TerminalArgs{TerminalID: id}, &wire.ExecOutputResult{})
		rec.Kind, rec.Outcome = audit.KindResult, "claimed"
		if err != nil {
			code, _ := codeMessage(err)
			rec.Outcome, rec.Code = "", string(code)
		}
		c.audit(rec)
	}
}
