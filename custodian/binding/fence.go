package binding

import (
	"errors"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
)

// The fences decided after a callback was admitted: the receiver
// connection of the attach's epoch is gone (fate_unknown), or the op
// store or the receiver says another custodian owns the session now
// (fenced). A connection's loss is also seen by its watcher (FenceEpoch).

// FenceEpoch fences s if it was attached on epoch, whose receiver
// connection was lost (cause), and records the fence once.
func (k *Keeper) FenceEpoch(s *Session, epoch uint64, cause string) {
	if s.fenceEpoch(epoch, cause) {
		k.auditFence(s, errcode.CodeFateUnknown)
	}
}

// ConnLost is FenceEpoch for a call whose connection was found gone
// before anything was sent; it returns the call's fenced refusal.
func (cl *Call) ConnLost(err error) error {
	cl.k.FenceEpoch(cl.Session, cl.Epoch, err.Error())
	return acperr.NewError(errcode.CodeFenced, "session %s: %v; reattach with %s",
		cl.Session.ID, err, acpmeta.MethodAttach)
}

// lostOwnership fences s after the op store or the receiver said another
// custodian owns the session now (ErrFenced, or the receiver's fenced):
// nothing more is sent for it, and the token is dropped so that an
// attach claims the session again (refused while the other owner lives).
func (k *Keeper) lostOwnership(s *Session, why string) {
	s.token.Store(0)
	if s.fence(errcode.CodeFenced, why) {
		k.auditFence(s, errcode.CodeFenced)
	}
}

// SentAndFenced is lostOwnership for a request the receiver answered
// fenced; any other err leaves s as it is.
func (k *Keeper) SentAndFenced(s *Session, err error) {
	if fencedByReceiver(err) {
		k.lostOwnership(s, err.Error())
	}
}

// fencedByReceiver reports whether err is the receiver's fenced answer.
func fencedByReceiver(err error) bool {
	var we *errcode.Error
	return errors.As(err, &we) && we.Code == errcode.CodeFenced
}

// ClaimRefusal turns a failed claim of session sid in the fleet's op
// store into the agent's error.
func ClaimRefusal(sid string, err error) error {
	switch {
	case errors.Is(err, opstore.ErrOwned):
		return acperr.NewError(errcode.CodeFenced, "session %s: %v; another custodian may take it over only once that owner's lease ends (tether-custodian run --standby)", sid, err)
	case errors.Is(err, opstore.ErrFenced):
		return acperr.NewError(errcode.CodeFenced, "session %s: %v", sid, err)
	case errors.Is(err, opstore.ErrUnavailable):
		return acperr.NewError(errcode.CodeUnavailable, "session %s: the fleet's op store: %v", sid, err)
	case errors.Is(err, opstore.ErrInvalid):
		return acperr.NewError(errcode.CodeInvalid, "session %s: %v", sid, err)
	}
	return acperr.NewError(errcode.CodeInternal, "session %s: claim in the fleet's op store failed", sid)
}

// StoreRefused decides a keyed call the op store refused to begin:
// op_key_conflict (counted), fenced (another custodian owns the session:
// the session is fenced), or unavailable; ok is false for an err none of
// these.
func (cl *Call) StoreRefused(err error) (refusal error, ok bool) {
	switch {
	case errors.Is(err, opstore.ErrConflict):
		cl.Refuse(errcode.CodeOpKeyConflict)
		return acperr.NewError(errcode.CodeOpKeyConflict, "%v", err), true
	case errors.Is(err, opstore.ErrFenced), errors.Is(err, opstore.ErrNotClaimed):
		cl.k.lostOwnership(cl.Session, err.Error())
		return acperr.NewError(errcode.CodeFenced, "session %s: %v; nothing was sent", cl.Session.ID, err), true
	case err != nil:
		return acperr.NewError(errcode.CodeUnavailable, "custodian cannot record the dispatch durably: %v", err), true
	}
	return nil, false
}
