package opstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/backoff"
	"github.com/tetherdev/tether/admission/strictjson"
)

// Claimed is what a successful claim of a session returns.
type Claimed struct {
	// Token is the fencing token: the create revision of the session's
	// owner key. It is higher than every token any earlier owner held.
	Token uint64
	// Interrupted lists the op keys an earlier owner left in flight
	// (dispatched, or an exec whose exit it never observed), now recorded
	// Interrupted: their fate is unknown and they are never dispatched
	// again.
	Interrupted []string
	// Binding is the session's binding record, if an owner recorded one.
	Binding *BindingRecord
}

// Claim makes this store the session's owner, if no live custodian owns
// it: the owner key is created bound to this store's lease. Then every
// key an earlier owner left in flight is made Interrupted, each in a
// transaction fenced by the new token. A session another live custodian
// owns fails with an *OwnedError (ErrOwned). Claiming a session this
// store already owns returns its token again. If the store's own lease is
// lost, Claim first replaces it (etcd_lease.go) and claims afresh: the
// new token is higher and the keys left in flight under the lost lease,
// this store's own included, are interrupted.
func (s *EtcdStore) Claim(ctx context.Context, sessionID string) (Claimed, error) {
	if sessionID == "" {
		return Claimed{}, fmt.Errorf("%w: empty session id", ErrInvalid)
	}
	tok, err := s.Token(sessionID)
	switch {
	case err == nil:
		return Claimed{Token: tok}, nil
	case !isNotClaimed(err) && !errors.Is(err, ErrFenced): // closed
		return Claimed{}, err
	}
	tok, sess, err := s.claimOwner(ctx, sessionID)
	if err != nil {
		return Claimed{}, err
	}
	if err := s.record(sessionID, tok, sess); err != nil {
		return Claimed{}, err
	}
	keys, err := s.takeover(ctx, sessionID, tok)
	if err != nil {
		s.forget(sessionID, tok)
		return Claimed{Token: tok}, err
	}
	b, err := s.Binding(ctx, sessionID)
	if err != nil && !isNotFound(err) {
		s.forget(sessionID, tok)
		return Claimed{Token: tok, Interrupted: keys}, err
	}
	return Claimed{Token: tok, Interrupted: keys, Binding: b}, nil
}

// forget drops a claim whose takeover did not finish, so the next Claim
// finds the owner key (ours, by its lease) and runs the takeover again
// instead of answering from the local claim with keys left in flight.
func (s *EtcdStore) forget(sid string, tok uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owned[sid] == tok {
		delete(s.owned, sid)
	}
}

// createOwner creates the owner key bound to sess's lease if it does not
// exist and returns its create revision.
func (s *EtcdStore) createOwner(ctx context.Context, sid string, sess *concurrency.Session) (uint64, error) {
	k := s.ownerKey(sid)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, s.marshalOwner(sess), clientv3.WithLease(sess.Lease()))).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return 0, unavailable("claim session "+sid, err)
	}
	if resp.Succeeded {
		return uint64(resp.Header.Revision), nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // deleted in between; the caller may try again
		return 0, &OwnedError{SessionID: sid, Owner: "(released meanwhile)"}
	}
	if clientv3.LeaseID(kvs[0].Lease) == sess.Lease() { // ours, from a claim whose answer was lost
		return uint64(kvs[0].CreateRevision), nil
	}
	var o owner
	_ = json.Unmarshal(kvs[0].Value, &o)
	return 0, &OwnedError{SessionID: sid, Owner: o.Name, Token: uint64(kvs[0].CreateRevision)}
}

// claimRetry is how long WaitClaim waits before asking etcd again after it
// did not answer.
const claimRetry = 100 * time.Millisecond

// WaitClaim claims the session as soon as no live custodian owns it: it
// watches the owner key and claims when the owner's lease expires (or the
// owner releases it). It returns when the claim succeeds, fails for
// another reason than ErrOwned, ErrUnavailable or ErrFenced, or ctx ends:
// etcd not answering is waited out, as a standby must, and so is a claim
// that lost the session (its lease lapsed, or another custodian claimed
// first) before it finished. This is what a standby runs, and what an
// owner runs after Begin answered ErrFenced or ErrNotClaimed.
func (s *EtcdStore) WaitClaim(ctx context.Context, sessionID string) (Claimed, error) {
	for {
		c, err := s.Claim(ctx, sessionID)
		if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrFenced) { // a member restarting, a leader election, a lapsed lease
			if err := backoff.Sleep(ctx, claimRetry); err != nil {
				return Claimed{}, fmt.Errorf("claim session %s: %w (last: %w)", sessionID, err, ErrUnavailable)
			}
			continue
		}
		if !isOwned(err) {
			return c, err
		}
		if err := s.waitOwnerGone(ctx, sessionID); err != nil {
			return Claimed{}, err
		}
	}
}

// waitOwnerGone returns once the session's owner key does not exist.
func (s *EtcdStore) waitOwnerGone(ctx context.Context, sid string) error {
	k := s.ownerKey(sid)
	resp, err := s.cli.Get(ctx, k)
	if err != nil {
		return unavailable("watch the owner of session "+sid, err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range s.cli.Watch(wctx, k, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return nil // compaction or a lost leader: look again
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("wait for the owner of session %s: %w", sid, context.Cause(ctx))
	}
	return nil
}

// takeover makes every key the session's earlier owners left open
// Interrupted, fenced by tok. It returns their op keys (the open markers
// hold store keys, Key).
func (s *EtcdStore) takeover(ctx context.Context, sid string, tok uint64) ([]string, error) {
	resp, err := s.cli.Get(ctx, s.openPrefix(sid), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, unavailable("list the keys left in flight in session "+sid, err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		key := string(kv.Key[len(s.openPrefix(sid)):])
		if err := s.interruptOne(ctx, sid, tok, key); err != nil {
			return keys, err
		}
		keys = append(keys, opKeyOf(key))
	}
	return keys, nil
}

// interruptOne records key Interrupted (or only closes it, if it is
// final already).
func (s *EtcdStore) interruptOne(ctx context.Context, sid string, tok uint64, key string) error {
	r, rev, err := s.read(ctx, key)
	if isNotFound(err) {
		if _, err := s.cli.Txn(ctx).If(s.ownedBy(sid, tok)).Then(clientv3.OpDelete(s.openPrefix(sid) + key)).Commit(); err != nil {
			return unavailable("close op key "+key+" left in flight", err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	now := s.opts.Now().UTC()
	switch r.Outcome {
	case Dispatched:
		r = interrupted(intentOf(r), now, "the custodian that owned the session lost it before the result was recorded (takeover)")
	case Pending:
		interruptPending(r, now, "the custodian that owned the session lost it before the exit was observed (takeover)")
	}
	return s.putFenced(sid, tok, key, rev, r)
}

// Release gives up a session this store owns (deleting its owner key, if
// it is still the one claimed), so a standby may claim it at once.
func (s *EtcdStore) Release(ctx context.Context, sessionID string) error {
	tok, err := s.Token(sessionID)
	if err != nil {
		return err
	}
	_, err = s.cli.Txn(ctx).If(s.ownedBy(sessionID, tok)).Then(clientv3.OpDelete(s.ownerKey(sessionID))).Commit()
	if err != nil {
		return unavailable("release session "+sessionID, err)
	}
	s.mu.Lock()
	delete(s.owned, sessionID)
	s.mu.Unlock()
	return nil
}

// BindingRecord is what a standby needs to take a session over: the tuple
// it is bound to, its lease and the principal.
type BindingRecord struct {
	SessionID     string          `json:"session_id"`
	Tuple         admission.Tuple `json:"tuple"`
	TupleSHA256   string          `json:"tuple_sha256"`
	LeaseNotAfter time.Time       `json:"lease_not_after"`
	Principal     string          `json:"principal"`
}

func (b *BindingRecord) validate() error {
	if err := b.Tuple.Validate(); err != nil {
		return fmt.Errorf("%w: binding: %w", ErrInvalid, err)
	}
	if b.SessionID == "" || b.Principal == "" || b.TupleSHA256 != b.Tuple.SHA256() {
		return fmt.Errorf("%w: binding: session, principal and the tuple's digest are required", ErrInvalid)
	}
	return nil
}

// PutBinding records the session's binding, fenced by this store's token.
func (s *EtcdStore) PutBinding(ctx context.Context, b BindingRecord) error {
	if err := b.validate(); err != nil {
		return err
	}
	tok, err := s.claimed(b.SessionID)
	if err != nil {
		return err
	}
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	resp, err := s.cli.Txn(ctx).If(s.ownedBy(b.SessionID, tok)).
		Then(clientv3.OpPut(s.bindingKey(b.SessionID), string(data))).Commit()
	if err != nil {
		return unavailable("record the binding of session "+b.SessionID, err)
	}
	if !resp.Succeeded {
		return s.fenced(b.SessionID, tok)
	}
	return nil
}

// Binding returns the session's binding record (ErrNotFound if none).
func (s *EtcdStore) Binding(ctx context.Context, sessionID string) (*BindingRecord, error) {
	resp, err := s.cli.Get(ctx, s.bindingKey(sessionID))
	if err != nil {
		return nil, unavailable("read the binding of session "+sessionID, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: binding of session %s", ErrNotFound, sessionID)
	}
	var b BindingRecord
	if err := strictjson.Decode(resp.Kvs[0].Value, maxRecordBytes, &b); err != nil {
		return nil, fmt.Errorf("%w: binding of session %s: %w", ErrCorrupt, sessionID, err)
	}
	if err := b.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return &b, nil
}

func isNotFound(err error) bool   { return errors.Is(err, ErrNotFound) }
func isOwned(err error) bool      { return errors.Is(err, ErrOwned) }
func isNotClaimed(err error) bool { return errors.Is(err, ErrNotClaimed) }
