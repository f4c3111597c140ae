package server

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/binding"
	"github.com/tetherdev/tether/plugin/contract"
	"github.com/tetherdev/tether/plugin/toolplan"
)

// fenceCodes are the client's answers that mean the binding itself is in
// doubt: a request refused with one of them fences the binding (rule 6),
// as does a lost connection. Every plan carries them.
var fenceCodes = []errcode.Code{errcode.CodeFateUnknown, errcode.CodeFenced, errcode.CodeLeaseExpired,
	errcode.CodeNotAdmitted, errcode.CodeTupleMismatch, errcode.CodeUnavailable}

// reportSlack is how long past a call's clean-up its reports are still
// accepted.
const reportSlack = 5 * time.Second

// Authorize implements contract.Plugin: the session must be bound, attached
// on this connection, unfenced and within its lease (binding.Authorize);
// the arguments are checked and every request built with its op tag
// before anything may be sent. The plan's deadline is the tool's
// (default 60 s, at most 1 h), capped by the lease.
func (s *Server) Authorize(ctx context.Context, tc contract.ToolCall) (contract.Plan, error) {
	if _, err := s.principal(tc.ConnID); err != nil {
		return contract.Plan{}, err
	}
	g, err := s.table.Authorize(tc.ConnID, tc.SessionID)
	if err != nil {
		return contract.Plan{}, err
	}
	key, err := toolplan.OpKey(tc.OpKey)
	if err != nil {
		return contract.Plan{}, err
	}
	deadline, err := s.deadline(tc.Timeout, g)
	if err != nil {
		return contract.Plan{}, err
	}
	c := toolplan.Call{SessionID: g.SessionID, Root: g.Tuple.Root, TupleSHA256: g.TupleSHA256, OpKey: key, Deadline: deadline}
	step, err := planStep(c, tc.Tool)
	if err != nil {
		return contract.Plan{}, err
	}
	tk := ticket{Conn: tc.ConnID, Session: g.SessionID, Epoch: g.Epoch,
		Expires: deadline.Add(toolplan.CleanupTimeout + reportSlack).UnixMilli()}
	return contract.Plan{Ticket: s.tickets.mint(tk), SessionID: g.SessionID, OpKey: key, Deadline: deadline,
		FenceCodes: slices.Clone(fenceCodes), Step: step}, nil
}

// deadline is now + timeout (0 = the default), capped by the grant's end.
func (s *Server) deadline(timeout time.Duration, g binding.Grant) (time.Time, error) {
	switch {
	case timeout < 0 || timeout > MaxToolTimeout:
		return time.Time{}, errcode.Errorf(errcode.CodeInvalid, "timeout_ms must be 0..%d", MaxToolTimeout.Milliseconds())
	case timeout == 0:
		timeout = DefaultToolTimeout
	}
	deadline := s.now().Add(timeout)
	if g.NotAfter.Before(deadline) {
		deadline = g.NotAfter
	}
	return deadline, nil
}

// planStep builds the step of one tool.
func planStep(c toolplan.Call, t contract.Tool) (contract.Step, error) {
	switch t := t.(type) {
	case contract.ReadTool:
		return c.Read(t.Path, t.Line, t.Limit)
	case contract.WriteTool:
		return c.Write(t.Path, t.Content)
	case contract.EditTool:
		return c.Edit(t.Path, t.OldText, t.NewText)
	case contract.ListTool:
		return c.List(t.Path)
	case contract.RunTool:
		return c.Run(t)
	case contract.GlobTool:
		return c.Glob(t.Pattern, t.Dir)
	case contract.GrepTool:
		return c.Grep(t.Pattern, t.Dir, t.Fixed, t.IgnoreCase)
	}
	return nil, errcode.Errorf(errcode.CodeInvalid, "unknown tool %T", t)
}

// Report implements contract.Plugin. The ticket must be one this plugin
// issued on this connection. Each failure with a fence code, or a lost
// connection, fences the binding the call was authorized under (if it is
// still that binding: a later reattach is not undone by a stale failure).
// Check then refuses unless that binding still holds: not fenced or
// reattached since, lease current, the call not over.
func (s *Server) Report(ctx context.Context, r contract.Report) error {
	tk, err := s.tickets.open(r.ConnID, r.Ticket)
	if err != nil {
		return err
	}
	g := binding.Grant{SessionID: tk.Session, Epoch: tk.Epoch}
	for _, f := range r.Failures {
		if f.Transport || slices.Contains(fenceCodes, f.Code) {
			s.table.Fence(g, fenceCode(f), fmt.Sprintf("client answered %s to %s: %s", fenceCode(f), f.Request, f.Message))
			break
		}
	}
	if !r.Check {
		return nil
	}
	if s.tickets.expired(tk) {
		return errcode.Errorf(errcode.CodeTimeout, "report: the call's time is over; its result cannot be checked")
	}
	return s.table.Check(g)
}

// fenceCode is the code a failure fences with: a lost connection is
// fate_unknown.
func fenceCode(f contract.Failure) errcode.Code {
	if f.Transport {
		return errcode.CodeFateUnknown
	}
	return f.Code
}
