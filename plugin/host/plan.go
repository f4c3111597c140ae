package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// toolCall is one authorized tool call: the plan the plugin issued for it,
// which is the only thing it may send.
type toolCall struct {
	c    *Conn
	tool string
	plan contract.Plan
}

// authorize asks the plugin for the call's plan and checks that the plan
// is one this call can carry out. A call whose caller has cancelled sends
// nothing (*CancelledError); a refusal is the plugin's *errcode.Error; a plan
// that does not fit the call is ErrBadPlan, and nothing of it is sent.
func (c *Conn) authorize(ctx context.Context, sessionID string, o CallOptions, t contract.Tool) (*toolCall, error) {
	if ctx.Err() != nil {
		return nil, &CancelledError{Tool: t.Name(), Cause: context.Cause(ctx)}
	}
	p, err := c.plugin.Authorize(ctx, contract.ToolCall{ConnID: c.id, SessionID: sessionID, OpKey: o.OpKey,
		Timeout: o.Timeout, Tool: t})
	var we *errcode.Error
	switch {
	case err != nil && ctx.Err() != nil && !errors.As(err, &we):
		return nil, &CancelledError{Tool: t.Name(), Cause: context.Cause(ctx)}
	case err != nil:
		return nil, err
	}
	if err := checkPlan(t, sessionID, p); err != nil {
		return nil, fmt.Errorf("%w: %s in session %q: %v; nothing was sent", ErrBadPlan, t.Name(), sessionID, err)
	}
	return &toolCall{c: c, tool: t.Name(), plan: p}, nil
}

// checkPlan checks that p can serve tool t in sessionID: the session, a
// ticket, a deadline and an op key are set; the step is the tool's; every
// request carries `tether/op` and no key outside the contract.
func checkPlan(t contract.Tool, sessionID string, p contract.Plan) error {
	switch {
	case p.SessionID != sessionID:
		return fmt.Errorf("the plan is for session %q", p.SessionID)
	case p.Ticket == "" || p.Deadline.UnixMilli() <= 0:
		return errors.New("the plan has no ticket or no deadline")
	case !acpmeta.ValidOpKey(p.OpKey):
		return fmt.Errorf("the plan's op key %q is malformed", p.OpKey)
	}
	switch st := p.Step.(type) {
	case contract.ReadStep:
		return allOf(is[contract.ReadTool](t), opOnly(st.Meta))
	case contract.WriteStep:
		return allOf(is[contract.WriteTool](t), opOnly(st.Meta))
	case contract.EditStep:
		return allOf(is[contract.EditTool](t), opOnly(st.ReadMeta), opOnly(st.WriteMeta))
	case contract.TerminalStep:
		return checkTerminal(t, st)
	}
	return fmt.Errorf("the plan's step is %T", p.Step)
}

// checkTerminal: a terminal step serves run_command, list_directory, glob
// and grep; only run_command's create may carry `tether/verify`, and the
// shell tools name the directory their result is under.
func checkTerminal(t contract.Tool, st contract.TerminalStep) error {
	_, run := t.(contract.RunTool)
	create := opOnly(st.CreateMeta)
	if run {
		create = metaKeys(st.CreateMeta, acpmeta.KeyVerify)
	}
	var kind error
	switch t.(type) {
	case contract.RunTool:
	case contract.ListTool, contract.GlobTool, contract.GrepTool:
		if st.Dir == "" {
			kind = errors.New("the plan names no directory for the result")
		}
	default:
		kind = fmt.Errorf("a terminal run cannot serve %s", t.Name())
	}
	if st.CleanupTimeout <= 0 || st.CleanupTimeout > contract.MaxCleanupTimeout {
		kind = errors.Join(kind, fmt.Errorf("clean-up time %v is not in (0, %v]", st.CleanupTimeout, contract.MaxCleanupTimeout))
	}
	return allOf(kind, create, opOnly(st.WaitMeta), opOnly(st.KillMeta), opOnly(st.OutputMeta), opOnly(st.ReleaseMeta))
}

// is checks that t is a T.
func is[T contract.Tool](t contract.Tool) error {
	if _, ok := t.(T); !ok {
		var want T
		return fmt.Errorf("the plan's step serves %s, not %s", want.Name(), t.Name())
	}
	return nil
}

func allOf(errs ...error) error { return errors.Join(errs...) }

func opOnly(m contract.Meta) error { return metaKeys(m) }

// metaKeys checks that m carries `tether/op` and otherwise only the
// optional keys given.
func metaKeys(m contract.Meta, optional ...string) error {
	if _, ok := m[acpmeta.KeyOp]; !ok {
		return fmt.Errorf("a request carries no %s", acpmeta.KeyOp)
	}
	for k := range m {
		if k != acpmeta.KeyOp && !slices.Contains(optional, k) {
			return fmt.Errorf("a request carries _meta key %q, outside the contract", k)
		}
	}
	return nil
}

// reportTimeout bounds a report to the plugin; a report is never cut
// short by the caller's cancel.
const reportTimeout = 10 * time.Second

// report tells the plugin what it must decide on.
func (x *toolCall) report(ctx context.Context, failures []contract.Failure, check bool) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	return x.c.plugin.Report(rctx, contract.Report{ConnID: x.c.id, Ticket: x.plan.Ticket, Failures: failures, Check: check})
}

// failure is the report entry for a request's error, if the plugin must
// see it: the connection lost, or a refusal with one of the plan's fence
// codes.
func (x *toolCall) failure(request string, err error) (contract.Failure, bool) {
	if errors.Is(err, contract.ErrTransport) {
		return contract.Failure{Request: request, Transport: true, Message: err.Error()}, true
	}
	code, ok := acperr.CodeOf(err)
	if !ok || !slices.Contains(x.plan.FenceCodes, code) {
		return contract.Failure{}, false
	}
	return contract.Failure{Request: request, Code: code, Message: contract.PeerMessage(err)}, true
}

// fenceFailures reports the failures the plugin must fence on, if any,
// before the call returns; err is the call's own error, which it returns
// (with the report's failure if the plugin could not be told).
func (x *toolCall) fenceFailures(ctx context.Context, failures []contract.Failure, err error) error {
	if len(failures) == 0 {
		return err
	}
	if rerr := x.report(ctx, failures, false); rerr != nil {
		return errors.Join(err, fmt.Errorf("report the binding error to the plugin: %w", rerr))
	}
	return err
}
