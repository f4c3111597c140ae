package binding

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/receiver/wire"
)

// maxAttachParams bounds `_tether/attach` params: two short strings.
const maxAttachParams = 4 << 10

// parseAttach strictly decodes `_tether/attach` params.
func parseAttach(params json.RawMessage) (acpmeta.AttachRequest, error) {
	var req acpmeta.AttachRequest
	if err := strictjson.Decode(params, maxAttachParams, &req); err != nil || req.SessionID == "" || !acpmeta.ValidDigest(req.TupleSHA256) {
		return acpmeta.AttachRequest{}, acperr.NewError(errcode.CodeInvalid,
			"%s params must be exactly {session_id, tuple_sha256 (lowercase hex)}", acpmeta.MethodAttach)
	}
	return req, nil
}

// Attach serves the agent's `_tether/attach`: it confirms with the
// receiver that a current grant covers the session's tuple and
// (re)activates the binding on the live connection. This is the only way
// out of a fence. An attach may claim the pending bind of a session/new
// in flight (by its tuple digest).
func (t *Table) Attach(ctx context.Context, params json.RawMessage) (acpmeta.AttachResponse, error) {
	req, err := parseAttach(params)
	if err != nil {
		t.Refused(nil, errcode.CodeInvalid, audit.RefusalEvent{Method: acpmeta.MethodAttach})
		return acpmeta.AttachResponse{}, err
	}
	s := t.forAttach(req.SessionID, req.TupleSHA256)
	if s == nil {
		t.Refused(nil, errcode.CodeNotAdmitted, audit.RefusalEvent{Method: acpmeta.MethodAttach})
		return acpmeta.AttachResponse{}, acperr.NewError(errcode.CodeNotAdmitted, "session %q has no bind on this connection", req.SessionID)
	}
	if req.TupleSHA256 != s.Digest {
		return acpmeta.AttachResponse{}, t.mismatch(s, acpmeta.MethodAttach, "attach names tuple_sha256 %s, the session is bound to %s",
			req.TupleSHA256, s.Digest)
	}
	return t.attach(ctx, s, "")
}

// selfAttach attaches a plain agent's binding on the custodian's own
// initiative (the agent knows no `_tether/attach`); its audit record says
// tagged_by custodian.
func (t *Table) selfAttach(ctx context.Context, s *Session) error {
	_, err := t.attach(ctx, s, TaggedByCustodian)
	return err
}

// attach asks the receiver whether a current grant covers s's tuple and,
// if so, (re)activates s on the live connection.
func (t *Table) attach(ctx context.Context, s *Session, taggedBy string) (acpmeta.AttachResponse, error) {
	k := t.k
	if err := k.h.AuditErr(); err != nil {
		return acpmeta.AttachResponse{}, err
	}
	refuse := func(code errcode.Code) {
		t.Refused(s, code, audit.RefusalEvent{Method: acpmeta.MethodAttach, TaggedBy: taggedBy})
	}
	rec := audit.Record{Kind: audit.KindAttach, SessionID: s.ID, TupleSHA256: s.Digest,
		Principal: s.Principal, Method: acpmeta.MethodAttach, TaggedBy: taggedBy}
	if s.overBudget() {
		refuse(errcode.CodeFenced)
		return acpmeta.AttachResponse{}, acperr.NewError(errcode.CodeFenced,
			"session %s passed its refusal budget and is fenced for good; start a new session", s.ID)
	}
	lease := s.Lease()
	if !k.h.Now().Before(lease) {
		refuse(errcode.CodeLeaseExpired)
		return acpmeta.AttachResponse{}, acperr.NewError(errcode.CodeLeaseExpired, "lease ended at %s", lease.UTC().Format(time.RFC3339))
	}
	if err := k.h.Claim(ctx, s); err != nil { // the session's fencing token, before the receiver sees it
		refuse(codeOrInternal(err))
		return acpmeta.AttachResponse{}, Refusal(err)
	}
	res, epoch, err := k.h.AskReceiver(ctx, s)
	if fencedByReceiver(err) {
		k.lostOwnership(s, err.Error())
	}
	rec.GrantGeneration, rec.FenceToken = res.GrantGeneration, s.FenceToken()
	if err == nil {
		err = checkGrant(res, k.h.Now())
	}
	if err != nil { // counted like every refusal: a plain agent's callbacks retry it while the link is down
		refuse(codeOrInternal(err))
		return acpmeta.AttachResponse{}, Refusal(err)
	}
	s.attached(epoch, res.GrantGeneration)
	k.h.Attached(ctx, s, epoch, rec)
	return acpmeta.AttachResponse{LeaseNotAfter: lease.UTC(), GrantGeneration: res.GrantGeneration}, nil
}

func checkGrant(res wire.AttachResult, now time.Time) error {
	switch {
	case res.GrantGeneration == 0:
		return errcode.Errorf(errcode.CodeNotAdmitted, "receiver answered attach with grant generation 0")
	case !res.NotAfter.After(now):
		return errcode.Errorf(errcode.CodeLeaseExpired, "grant ended at %s", res.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

func codeOrInternal(err error) errcode.Code {
	if code, ok := acperr.CodeOf(err); ok {
		return code
	}
	return errcode.CodeInternal
}

// Refusal converts any error into the JSON-RPC error returned to the
// agent: a tether code from the closed set and a message naming the check.
// Errors that carry no code become internal, with a generic message, so
// internals never leak to the agent.
func Refusal(err error) *acp.RequestError {
	var re *acp.RequestError
	if errors.As(err, &re) {
		if _, ok := acperr.CodeOf(re); ok {
			return re
		}
	}
	var we *errcode.Error
	if errors.As(err, &we) && we.Code.Valid() {
		return acperr.NewError(we.Code, "%s", we.Message)
	}
	return acperr.NewError(errcode.CodeInternal, "custodian internal error")
}
