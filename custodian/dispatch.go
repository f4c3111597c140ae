package custodian

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/binding"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// call is one callback custodian/binding admitted (binding.Call), with
// the custodian's side of its session.
type call struct {
	*binding.Call
	c *Custodian
	b *session
}

// step calls the test hook, if any, at a named step of cl.
func (cl *call) step(ctx context.Context, name string) {
	if h := cl.c.hook; h != nil {
		h(ctx, cl.Method, name)
	}
}

// auditDispatch appends the dispatch record of a call about to be sent.
// The log may have broken or closed since the call's auditErr check, so
// its refusal stops the call here: nothing is sent unaudited, and the
// caller answers with the unavailable error returned.
func (c *Custodian) auditDispatch(r audit.Record) error {
	if _, err := c.alog.Append(r); err != nil {
		c.log.Error("audit append", "kind", r.Kind, "err", err)
		return refusalUnavailable("audit log refused the dispatch record, refusing to act unaudited: %v", err)
	}
	return nil
}

// audit appends r; a failure is logged, and auditErr then refuses every
// dispatch.
func (c *Custodian) audit(r audit.Record) {
	if _, err := c.alog.Append(r); err != nil {
		c.log.Error("audit append", "kind", r.Kind, "err", err)
	}
}

// auditErr refuses to act when the audit log cannot record it.
func (c *Custodian) auditErr() error {
	if err := c.alog.Err(); err != nil {
		return refusalUnavailable("audit log unavailable, refusing to act unaudited: %v", err)
	}
	return nil
}

// refusalUnavailable is the custodian's refusal when its audit log cannot
// record an act.
func refusalUnavailable(format string, args ...any) error {
	return acperr.NewError(errcode.CodeUnavailable, format, args...)
}

// flushRefusals writes the pending folds and refusals (before a
// checkpoint and at Close).
func (c *Custodian) flushRefusals() {
	c.flushFolds()
	c.keeper.Flush()
}

// record returns an audit record describing this call.
func (cl *call) record(kind audit.Kind) audit.Record {
	return audit.Record{Kind: kind, SessionID: cl.b.ID, TupleSHA256: cl.b.Digest,
		Principal: cl.b.Principal, Method: cl.Method, OpKey: cl.Op.OpKey, TaggedBy: cl.TaggedBy}
}

// readOnly sends a request that changes nothing in the computer. It is not
// keyed durably; a cancel of the ACP request abandons it. annotate, if set,
// adds digests and sizes of the result to the audit record.
func (cl *call) readOnly(ctx context.Context, op wire.Op, args, result any, annotate func(*audit.Record)) error {
	return cl.readOnlyWith(ctx, func(ctx context.Context, conn ReceiverConn) error {
		return conn.CallFenced(ctx, op, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline, args, result)
	}, annotate)
}

// readOnlyWith is readOnly for a read that takes more than one request
// (a file read in chunks): send makes them on conn.
func (cl *call) readOnlyWith(ctx context.Context, send func(context.Context, ReceiverConn) error, annotate func(*audit.Record)) error {
	conn, err := cl.conn()
	if err != nil {
		return err
	}
	cl.step(ctx, "before-dispatch-audit")
	if err := cl.c.auditDispatch(cl.record(audit.KindDispatch)); err != nil {
		return err
	}
	ctx, cancel := context.WithDeadline(ctx, cl.Deadline)
	defer cancel()
	err = send(ctx, conn)
	rec := cl.record(audit.KindResult)
	cl.c.keeper.SentAndFenced(cl.Session, err)
	if err != nil {
		code, _ := codeMessage(err)
		rec.Code = string(code)
		cl.c.audit(rec)
		cl.logInternal(code, err)
		return refusal(err)
	}
	if annotate != nil {
		annotate(&rec)
	}
	cl.c.audit(rec)
	return nil
}

// conn returns the receiver connection of the binding's attach epoch, or
// fenced when the connection changed since: nothing is sent for a binding
// that has not reattached after a loss.
func (cl *call) conn() (ReceiverConn, error) {
	if err := cl.c.auditErr(); err != nil {
		return nil, err
	}
	conn, err := cl.b.Receiver.onEpoch(cl.Epoch)
	if err != nil {
		return nil, cl.ConnLost(err)
	}
	return conn, nil
}

// keyed describes one request that changes the computer.
type keyed struct {
	op     wire.Op
	args   any
	extra  any // more fields covered by the request digest
	result any // the receiver's result is decoded into it
	// settle builds the ACP response and the receipt from the result.
	settle func() (resp any, r *opstore.Receipt)
	// annotate adds digests and sizes to the dispatch audit record.
	annotate func(*audit.Record)
	// idempotent: repeating the op on the receiver changes nothing (a
	// SIGKILL of a group already signalled or dead, forgetting a terminal
	// already forgotten), so the key is claimed in memory and its receipt
	// written behind, with no durable intent before dispatch (docs/
	// custodian.md "Which calls spend the durable write").
	idempotent bool
	// digestArgs, if set, stands for args in the request digest (a write's
	// content is covered by its SHA-256, not encoded again).
	digestArgs any
	// send, if set, sends the request instead of one conn.Call of op (a
	// chunked write: begin, chunks, commit); it decodes into result.
	send func(ctx context.Context, conn ReceiverConn) error
	// notSent, if set, answers the request without sending it (a release
	// or kill of a terminal already released): the receipt holds this
	// note and the settled answer, the audit result record says
	// codeNotSent, and no dispatch record is written.
	notSent string
	// onReplay, if set, sees the receipt a retry is answered from (not an
	// interrupted one: that is answered interrupted) before its response
	// is returned.
	onReplay func(*opstore.Receipt)
	// annotateResult, if set, adds the answer's digests and sizes to the
	// audit result record.
	annotateResult func(*audit.Record)
	// tooLong, if set, reports whether the settled answer is surely too
	// long for any receipt to keep (a read's, which can hold a whole
	// file), and then the length of its JSON, counted without encoding
	// it: such an answer is not encoded at all, and settle returns no
	// JSON for it (the caller answers from its own value).
	tooLong func(resp any) (n int64, ok bool)
}

// annotation is the digests and sizes a keyed request's dispatch record
// carries, known before it is sent (keyed.annotate = annotation.apply).
type annotation struct {
	digests map[string]string
	sizes   map[string]int64
}

func (a annotation) apply(r *audit.Record) { r.Digests, r.Sizes = a.digests, a.sizes }

// codeNotSent is the audit result code of a keyed request answered
// without sending it (keyed.notSent).
const codeNotSent = "not_sent"

// keyed runs a request at most once per op key: the dispatch is made
// durable (one fdatasync) before the receiver sees it, unless the request
// is idempotent on the receiver (k.idempotent); a retry with the
// same key and digest gets the stored answer without running anything; a
// different digest or a duplicate in flight is op_key_conflict. It returns
// the ACP result's JSON, exactly as stored in the receipt.
func (cl *call) keyed(ctx context.Context, k keyed) (json.RawMessage, error) {
	dargs := k.args
	if k.digestArgs != nil {
		dargs = k.digestArgs
	}
	digest, err := requestDigest(cl.Method, cl.b.ID, cl.b.Digest, k.op, dargs, k.extra)
	if err != nil {
		return nil, refusal(err)
	}
	if err := cl.c.auditErr(); err != nil {
		return nil, err
	}
	begin := cl.c.store.Begin
	if k.idempotent {
		begin = cl.c.store.BeginIdempotent
	}
	cl.step(ctx, "before-intent")
	t, replay, err := begin(ctx, cl.intent(digest))
	if refused, ok := cl.StoreRefused(err); ok {
		return nil, refused
	}
	if replay != nil {
		return cl.replay(replay, k.onReplay)
	}
	cl.step(ctx, "after-intent")
	raw, err := cl.dispatch(ctx, t, digest, k)
	cl.step(ctx, "after-result")
	return raw, err
}

func (cl *call) intent(digest string) opstore.Intent {
	return opstore.Intent{OpKey: cl.Op.OpKey, RequestSHA256: digest, Method: cl.Method,
		SessionID: cl.b.ID, TupleSHA256: cl.b.Digest, Principal: cl.b.Principal,
		LeaseNotAfter: cl.b.Lease(), TaggedBy: cl.TaggedBy}
}

// dispatch sends a claimed keyed request and records its receipt.
func (cl *call) dispatch(ctx context.Context, t *opstore.Ticket, digest string, k keyed) (json.RawMessage, error) {
	if k.notSent != "" {
		return cl.settle(t, k)
	}
	conn, err := cl.conn()
	if err != nil {
		cl.finish(t, &opstore.Receipt{Outcome: opstore.Failed, Error: resultError(err), Note: "not sent"})
		return nil, err
	}
	rec := cl.record(audit.KindDispatch)
	rec.RequestSHA256 = digest
	if k.annotate != nil {
		k.annotate(&rec)
	}
	cl.step(ctx, "before-dispatch-audit")
	if err := cl.c.auditDispatch(rec); err != nil {
		cl.finish(t, &opstore.Receipt{Outcome: opstore.Failed, Error: resultError(err), Note: "not sent"})
		return nil, err
	}
	// The request runs to its own deadline even if the agent cancels the
	// ACP call: abandoning it would turn a known result into fate_unknown.
	callCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), cl.Deadline)
	defer cancel()
	if k.send != nil {
		err = k.send(callCtx, conn)
	} else {
		err = conn.CallFenced(callCtx, k.op, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline, k.args, k.result)
	}
	cl.step(ctx, "after-send")
	cl.c.keeper.SentAndFenced(cl.Session, err)
	if err != nil {
		r := failedReceipt(err)
		cl.logInternal(errcode.Code(r.Error.Code), err)
		cl.finish(t, r)
		return nil, acperr.NewError(errcode.Code(r.Error.Code), "%s", r.Error.Message)
	}
	return cl.settle(t, k)
}

// failedReceipt is the receipt of a keyed request the receiver refused
// or whose answer was lost: interrupted when its fate is unknown, or when
// a chunked write broke before its commit (then the note says the file is
// unchanged), failed otherwise.
func failedReceipt(err error) *opstore.Receipt {
	var bc *errBeforeCommit
	if errors.As(err, &bc) {
		code, _ := codeMessage(bc.err)
		if code == errcode.CodeFateUnknown || code == errcode.CodeUnavailable || code == errcode.CodeTimeout {
			return &opstore.Receipt{Outcome: opstore.Interrupted, Note: noteTransferBroken,
				Error: &opstore.ResultError{Code: string(errcode.CodeInterrupted), Message: bc.Error()}}
		}
		err = bc.err // refused (a chunk past the size bound, a revoked grant): that is the answer
	}
	code, msg := codeMessage(err)
	outcome := opstore.Failed
	if code == errcode.CodeFateUnknown {
		outcome = opstore.Interrupted
	}
	return &opstore.Receipt{Outcome: outcome, Error: &opstore.ResultError{Code: string(code), Message: msg}}
}

// noteTransferBroken explains the receipt of a chunked write whose
// transfer broke before its commit was sent.
const noteTransferBroken = "the transfer broke before its commit was sent; the receiver dropped the staged content and the file is unchanged"

// settle records the receipt of a request answered without error and
// returns its ACP result. An answer too large for the receipt is still
// returned; the receipt keeps its outcome and, in the answer's place, a
// too_large refusal for a retry.
func (cl *call) settle(t *opstore.Ticket, k keyed) (json.RawMessage, error) {
	resp, r := k.settle()
	if k.tooLong != nil {
		if n, ok := k.tooLong(resp); ok {
			notKept(r, n)
			cl.finishAnnotated(t, r, k.annotateResult)
			return nil, nil
		}
	}
	raw, err := json.Marshal(resp)
	if err != nil {
		cl.finish(t, &opstore.Receipt{Outcome: opstore.Failed, Error: resultError(err)})
		return nil, refusal(err)
	}
	r.Response = raw
	if !r.Fits() {
		notKept(r, int64(len(raw)))
	}
	cl.finishAnnotated(t, r, k.annotateResult)
	return raw, nil
}

// notKept makes r the receipt of an answer of n bytes too large to keep:
// no response, and a too_large refusal for a retry.
func notKept(r *opstore.Receipt, n int64) {
	r.Response = nil
	r.Note = fmt.Sprintf(noteAnswerNotKept, n)
	r.Error = &opstore.ResultError{Code: string(errcode.CodeTooLarge), Message: r.Note + "; nothing was run again"}
}

// noteAnswerNotKept explains the receipt of a request whose answer was too
// large to keep in it: a retry is refused too_large instead of replayed.
const noteAnswerNotKept = "answer of %d bytes not kept for replay: the receipt would pass its size bound"

// finish records the receipt and audits the result.
func (cl *call) finish(t *opstore.Ticket, r *opstore.Receipt) { cl.finishAnnotated(t, r, nil) }

// finishAnnotated is finish with annotate, if set, adding the answer's
// digests and sizes to the audit result record.
func (cl *call) finishAnnotated(t *opstore.Ticket, r *opstore.Receipt, annotate func(*audit.Record)) {
	if err := t.Finish(r); err != nil {
		cl.c.log.Error("record receipt", "op_key", cl.Op.OpKey, "err", err)
	}
	rec := cl.record(audit.KindResult)
	rec.RequestSHA256, rec.Outcome = t.Intent().RequestSHA256, string(r.Outcome)
	if r.Error != nil {
		rec.Code = r.Error.Code
	}
	if r.Exit != nil {
		rec.ExitCode, rec.Signal = r.Exit.ExitCode, r.Exit.Signal
	}
	if r.Note == noteAlreadyReleased || r.Note == noteReleasedAtWait {
		rec.Code = codeNotSent
	}
	if annotate != nil {
		annotate(&rec)
	}
	cl.c.audit(rec)
}

// replay answers a retry from its receipt, running nothing. An
// interrupted key is answered interrupted, with its receipt, even when a
// response was recorded before its fate became unknown (an exec's terminal
// id: the command's end was never observed); onReplay, if set, sees every
// other receipt before its response is returned.
func (cl *call) replay(r *opstore.Receipt, onReplay func(*opstore.Receipt)) (json.RawMessage, error) {
	rec := cl.record(audit.KindResult)
	rec.RequestSHA256, rec.Outcome, rec.Code = r.RequestSHA256, string(r.Outcome), "replay"
	cl.c.audit(rec)
	if r.Outcome == opstore.Interrupted {
		return nil, interruptedError(r)
	}
	if onReplay != nil {
		onReplay(r)
	}
	if r.Error != nil && r.Response == nil {
		code := errcode.Code(r.Error.Code)
		if !code.Valid() {
			code = errcode.CodeInternal
		}
		return nil, acperr.NewError(code, "%s", r.Error.Message)
	}
	return r.Response, nil
}

// resultError is the receipt form of a refusal: its code and the message
// it was built from, so a replay rebuilds the identical ACP error.
func resultError(err error) *opstore.ResultError {
	re := refusal(err)
	code, _ := acperr.CodeOf(re)
	msg := re.Message
	if data, ok := re.Data.(map[string]any); ok {
		if m, ok := data["message"].(string); ok {
			msg = m
		}
	}
	return &opstore.ResultError{Code: string(code), Message: msg}
}

// decodeResponse turns the stored ACP result back into its typed value.
func decodeResponse[T any](raw json.RawMessage, err error) (T, error) {
	var out T
	if err != nil {
		return out, err
	}
	if uerr := json.Unmarshal(raw, &out); uerr != nil {
		return out, acperr.NewError(errcode.CodeInternal, "stored response does not decode")
	}
	return out, nil
}

// logInternal logs the cause of an internal error: the agent gets a
// generic message (refusal), the operator's log gets the cause.
func (cl *call) logInternal(code errcode.Code, err error) {
	if code == errcode.CodeInternal {
		cl.c.log.Error("custodian: internal error", "method", cl.Method, "op_key", cl.Op.OpKey, "err", err)
	}
}

// interruptedError is the answer to a retry of an interrupted key: its
// code is interrupted whatever the receipt's error says, its message the
// receipt's, and its data carries the receipt itself.
func interruptedError(r *opstore.Receipt) *acp.RequestError {
	msg := r.Note
	if r.Error != nil && r.Error.Message != "" {
		msg = r.Error.Message
	}
	e := acperr.NewError(errcode.CodeInterrupted, "%s", msg)
	if raw, err := r.Marshal(); err == nil {
		e.Data.(map[string]any)["receipt"] = json.RawMessage(raw)
	}
	return e
}
