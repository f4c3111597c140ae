package custodian

import (
	"context"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/audit"
)

// Permission policies (Config.Permission): how session/request_permission
// is answered.
const (
	// PermissionReject picks a reject option (reject_once, else
	// reject_always), or cancels when none is offered. The default.
	PermissionReject = "reject"
	// PermissionAllowOnce picks allow_once, or cancels when it is not
	// offered (allow_always would grant more than asked for).
	PermissionAllowOnce = "allow_once"
	// PermissionAllowAlways picks allow_always, else allow_once, else
	// cancels.
	PermissionAllowAlways = "allow_always"
)

// PermissionOutcomeCancelled is the recorded answer when no offered option
// fits the policy.
const PermissionOutcomeCancelled = "cancelled"

func validPermission(p string) bool {
	switch p {
	case "", PermissionReject, PermissionAllowOnce, PermissionAllowAlways:
		return true
	}
	return false
}

// PermissionPolicy returns the ConnOptions.Permission answer of a policy
// ("" is PermissionReject): the first offered option of the kinds the
// policy accepts, in order, or cancelled.
func PermissionPolicy(policy string) func(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	kinds := map[string][]acp.PermissionOptionKind{
		"":                    {acp.PermissionOptionKindRejectOnce, acp.PermissionOptionKindRejectAlways},
		PermissionReject:      {acp.PermissionOptionKindRejectOnce, acp.PermissionOptionKindRejectAlways},
		PermissionAllowOnce:   {acp.PermissionOptionKindAllowOnce},
		PermissionAllowAlways: {acp.PermissionOptionKindAllowAlways, acp.PermissionOptionKindAllowOnce},
	}[policy]
	return func(_ context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		for _, k := range kinds {
			for _, o := range req.Options {
				if o.Kind == k {
					return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected(o.OptionId)}, nil
				}
			}
		}
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}, nil
	}
}

// PermissionAnswer is what a permission request was answered: the kind of
// the selected option, or PermissionOutcomeCancelled.
func PermissionAnswer(req acp.RequestPermissionRequest, resp acp.RequestPermissionResponse) string {
	if resp.Outcome.Selected == nil {
		return PermissionOutcomeCancelled
	}
	for _, o := range req.Options {
		if o.OptionId == resp.Outcome.Selected.OptionId {
			return string(o.Kind)
		}
	}
	return PermissionOutcomeCancelled
}

// Granted reports whether a PermissionAnswer allowed the tool call.
func Granted(answer string) bool {
	return answer == string(acp.PermissionOptionKindAllowOnce) || answer == string(acp.PermissionOptionKindAllowAlways)
}

// RequestPermission answers with ConnOptions.Permission, or rejects, and
// records the answer in the audit log (kind permission: the session, the
// answer as outcome, the digest of the tool call id; never its title or
// input, which may hold paths or argv), or, past the session's audit
// budget, folds it (auditfold.go).
func (h *client) RequestPermission(ctx context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	answer := h.conn.opts.Permission
	if answer == nil {
		answer = PermissionPolicy(PermissionReject)
	}
	resp, err := answer(ctx, req)
	rec := audit.Record{Kind: audit.KindPermission, SessionID: string(req.SessionId), Method: acp.ClientMethodSessionRequestPermission,
		Outcome: PermissionAnswer(req, resp), Digests: map[string]string{"tool_call_id": sha256Hex([]byte(req.ToolCall.ToolCallId))}}
	if err != nil {
		rec.Outcome, rec.Code = PermissionOutcomeCancelled, "error"
	}
	fold := h.conn.unboundPerms
	if row := h.conn.table.Get(string(req.SessionId)); row != nil {
		b := sessionOf(row)
		rec.TupleSHA256, rec.Principal = b.Digest, b.Principal
		fold = b.fold(h.c, rec.Method)
	}
	fold.record(rec)
	return resp, err
}
