package receiver

import (
	"context"
	"errors"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/wire"
)

// grant resolves the grant for digest allowing op, at request time, and
// re-checks what the receiver relies on even if the source is wrong: the
// grant names the tuple with this digest, has not ended, lists op, and
// never maps a child onto uid, gid or group 0.
func (h *Handler) grant(ctx context.Context, digest string, op admission.Op) (admission.Grant, error) {
	g, _, err := h.grants.Lookup(ctx, digest, op)
	if err != nil {
		return admission.Grant{}, lookupError(err)
	}
	return g, h.recheck(g, digest, op)
}

func (h *Handler) recheck(g admission.Grant, digest string, op admission.Op) error {
	switch {
	case g.Tuple.SHA256() != digest:
		return errcode.Errorf(errcode.CodeNotAdmitted, "grant source answered for tuple %s, not %s", g.Tuple.SHA256(), digest)
	case !h.now().Before(g.NotAfter):
		return errcode.Errorf(errcode.CodeLeaseExpired, "grant ended at %s", g.NotAfter.UTC().Format("2006-01-02T15:04:05Z07:00"))
	case !g.Allows(op):
		return errcode.Errorf(errcode.CodeDenied, "grant does not allow %s", op)
	case g.UID == 0 || g.GID == 0:
		return errcode.Errorf(errcode.CodeDenied, "grant maps children onto uid %d gid %d; id 0 is refused", g.UID, g.GID)
	}
	for _, gr := range g.Groups {
		if gr == 0 {
			return errcode.Errorf(errcode.CodeDenied, "grant lists supplementary group 0")
		}
	}
	return nil
}

// lookupError maps a GrantSource failure onto its code. Expiry is checked
// first: an expired snapshot is both untrusted and expired. Any failure
// the source does not classify refuses as not_admitted: there is no
// fallback.
func lookupError(err error) error {
	switch {
	case errors.Is(err, admission.ErrGrantExpired):
		return errcode.Errorf(errcode.CodeLeaseExpired, "%v", err)
	case errors.Is(err, admission.ErrOpNotAllowed):
		return errcode.Errorf(errcode.CodeDenied, "%v", err)
	case errors.Is(err, admission.ErrNoGrant):
		return errcode.Errorf(errcode.CodeNotAdmitted, "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errcode.Errorf(errcode.CodeTimeout, "grant lookup: %v", err)
	}
	return errcode.Errorf(errcode.CodeNotAdmitted, "no usable admission snapshot: %v", err)
}

// attachOps is the order attach tries grant ops in.
var attachOps = []admission.Op{admission.OpRead, admission.OpWrite, admission.OpList, admission.OpExec, admission.OpKill}

// attach confirms that a current grant covers the tuple and describes it.
// GrantSource answers per op, so attach asks for each until one is
// allowed; a grant that allows none is refused as denied.
func (h *Handler) attach(ctx context.Context, digest string) (*wire.AttachResult, error) {
	var last error
	for _, op := range attachOps {
		g, gen, err := h.grants.Lookup(ctx, digest, op)
		if errors.Is(err, admission.ErrOpNotAllowed) {
			last = err
			continue
		}
		if err != nil {
			return nil, lookupError(err)
		}
		if err := h.recheck(g, digest, op); err != nil {
			return nil, err
		}
		ops := make([]string, len(g.Ops))
		for i, o := range g.Ops {
			ops[i] = string(o)
		}
		return &wire.AttachResult{GrantGeneration: gen, NotAfter: g.NotAfter, Ops: ops}, nil
	}
	return nil, lookupError(last)
}
