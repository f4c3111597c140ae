package custodian

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/receiver/wire"
)

// HandleExtensionMethod serves the agent's extension methods; only
// `_tether/attach` is known.
func (h *client) HandleExtensionMethod(ctx context.Context, method string, params json.RawMessage) (any, error) {
	if method != acpmeta.MethodAttach {
		return nil, acp.NewMethodNotFound(method)
	}
	req, err := parseAttach(params)
	if err != nil {
		h.conn.auditRefusal(nil, method, "", errcode.CodeInvalid)
		return nil, err
	}
	return h.attach(ctx, req)
}

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

// attach confirms with the receiver that a current grant covers the
// session's tuple and (re)activates the binding on the live connection:
// this is the only way out of a fence.
func (h *client) attach(ctx context.Context, req acpmeta.AttachRequest) (any, error) {
	b := h.conn.table.forAttach(req.SessionID, req.TupleSHA256)
	if b == nil {
		h.conn.auditRefusal(nil, acpmeta.MethodAttach, "", errcode.CodeNotAdmitted)
		return nil, acperr.NewError(errcode.CodeNotAdmitted, "session %q has no bind on this connection", req.SessionID)
	}
	if req.TupleSHA256 != b.digest {
		return nil, h.mismatch(b, acpmeta.MethodAttach, "attach names tuple_sha256 %s, the session is bound to %s",
			req.TupleSHA256, b.digest)
	}
	return h.conn.attachBinding(ctx, b, "")
}

// selfAttach attaches a plain agent's binding on the custodian's own
// initiative (the agent knows no `_tether/attach`); its audit record says
// tagged_by custodian.
func (cn *Conn) selfAttach(ctx context.Context, b *binding) error {
	_, err := cn.attachBinding(ctx, b, TaggedByCustodian)
	return err
}

// attachBinding asks the receiver whether a current grant covers b's tuple
// and, if so, (re)activates b on the live connection.
func (cn *Conn) attachBinding(ctx context.Context, b *binding, taggedBy string) (acpmeta.AttachResponse, error) {
	c := cn.c
	if err := c.auditErr(); err != nil {
		return acpmeta.AttachResponse{}, err
	}
	rec := audit.Record{Kind: audit.KindAttach, SessionID: b.sessionID, TupleSHA256: b.digest,
		Principal: b.Principal, Method: acpmeta.MethodAttach, TaggedBy: taggedBy}
	if b.overBudget() {
		cn.refused(b, errcode.CodeFenced, audit.RefusalEvent{Method: acpmeta.MethodAttach, TaggedBy: taggedBy})
		return acpmeta.AttachResponse{}, acperr.NewError(errcode.CodeFenced,
			"session %s passed its refusal budget and is fenced for good; start a new session", b.sessionID)
	}
	lease := b.lease()
	if !c.now().Before(lease) {
		cn.refused(b, errcode.CodeLeaseExpired, audit.RefusalEvent{Method: acpmeta.MethodAttach, TaggedBy: taggedBy})
		return acpmeta.AttachResponse{}, acperr.NewError(errcode.CodeLeaseExpired, "lease ended at %s", lease.UTC().Format(time.RFC3339))
	}
	if err := c.claim(ctx, b); err != nil { // the session's fencing token, before the receiver sees it
		cn.refused(b, codeOrInternal(err), audit.RefusalEvent{Method: acpmeta.MethodAttach, TaggedBy: taggedBy})
		return acpmeta.AttachResponse{}, refusal(err)
	}
	res, epoch, err := c.askReceiver(ctx, b)
	if fencedByReceiver(err) {
		c.lostOwnership(b, err.Error())
	}
	rec.GrantGeneration, rec.FenceToken = res.GrantGeneration, b.fenceToken()
	if err == nil {
		err = checkGrant(res, c.now())
	}
	if err != nil { // counted like every refusal: a plain agent's callbacks retry it while the link is down
		cn.refused(b, codeOrInternal(err), audit.RefusalEvent{Method: acpmeta.MethodAttach, TaggedBy: taggedBy})
		return acpmeta.AttachResponse{}, refusal(err)
	}
	b.attached(epoch, res.GrantGeneration)
	cn.watch(b.Receiver)
	b.fold(c, acpmeta.MethodAttach).record(rec)
	c.claimTerminals(ctx, b, epoch)
	return acpmeta.AttachResponse{LeaseNotAfter: lease.UTC(), GrantGeneration: res.GrantGeneration}, nil
}

// askReceiver sends the attach op on the live connection (waiting for one
// up to the attach timeout) and returns the connection's epoch.
func (c *Custodian) askReceiver(ctx context.Context, b *binding) (wire.AttachResult, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.AttachTimeout)
	defer cancel()
	var res wire.AttachResult
	conn, epoch, err := b.Receiver.current(ctx, true)
	if err != nil {
		return res, 0, err
	}
	dl, _ := ctx.Deadline()
	if err := conn.CallFenced(ctx, wire.OpAttach, b.digest, newKey("attach"), b.fenceToken(), dl, &wire.AttachArgs{}, &res); err != nil {
		return res, 0, err
	}
	return res, epoch, nil
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

// newKey returns a fresh operation key with a prefix.
func newKey(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}
