package custodian

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
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
		h.c.auditRefusal(req.SessionID, nil, method, "", wire.CodeInvalid)
		return nil, err
	}
	return h.attach(ctx, req)
}

// parseAttach strictly decodes `_tether/attach` params.
func parseAttach(params json.RawMessage) (acpmeta.AttachRequest, error) {
	var req acpmeta.AttachRequest
	if err := decodeStrict(params, &req); err != nil || req.SessionID == "" || !acpmeta.ValidDigest(req.TupleSHA256) {
		return acpmeta.AttachRequest{}, acpmeta.NewError(wire.CodeInvalid,
			"%s params must be exactly {session_id, tuple_sha256 (lowercase hex)}", acpmeta.MethodAttach)
	}
	return req, nil
}

// attach confirms with the receiver that a current grant covers the
// session's tuple and (re)activates the binding on the live connection:
// this is the only way out of a fence.
func (h *client) attach(ctx context.Context, req acpmeta.AttachRequest) (any, error) {
	c := h.c
	b := h.conn.table.forAttach(req.SessionID, req.TupleSHA256)
	if b == nil {
		c.auditRefusal(req.SessionID, nil, acpmeta.MethodAttach, "", wire.CodeNotAdmitted)
		return nil, acpmeta.NewError(wire.CodeNotAdmitted, "session %q has no bind on this connection", req.SessionID)
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
	lease := b.lease()
	if !c.now().Before(lease) {
		rec.Kind, rec.Code = audit.KindRefusal, string(wire.CodeLeaseExpired)
		c.audit(rec)
		return acpmeta.AttachResponse{}, acpmeta.NewError(wire.CodeLeaseExpired, "lease ended at %s", lease.UTC().Format(time.RFC3339))
	}
	res, epoch, err := c.askReceiver(ctx, b)
	rec.GrantGeneration = res.GrantGeneration
	if err == nil {
		err = checkGrant(res, c.now())
	}
	if err != nil {
		rec.Code = string(codeOrInternal(err))
		c.audit(rec)
		return acpmeta.AttachResponse{}, refusal(err)
	}
	b.attached(epoch, res.GrantGeneration)
	cn.watch(b.Receiver)
	c.audit(rec)
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
	if err := conn.Call(ctx, wire.OpAttach, b.digest, newKey("attach"), dl, &wire.AttachArgs{}, &res); err != nil {
		return res, 0, err
	}
	return res, epoch, nil
}

func checkGrant(res wire.AttachResult, now time.Time) error {
	switch {
	case res.GrantGeneration == 0:
		return wire.Errorf(wire.CodeNotAdmitted, "receiver answered attach with grant generation 0")
	case !res.NotAfter.After(now):
		return wire.Errorf(wire.CodeLeaseExpired, "grant ended at %s", res.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

func codeOrInternal(err error) wire.Code {
	if code, ok := acpmeta.CodeOf(err); ok {
		return code
	}
	return wire.CodeInternal
}

// newKey returns a fresh operation key with a prefix.
func newKey(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// decodeStrict decodes exactly one JSON value, refusing unknown fields and
// trailing data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after value")
	}
	return nil
}
