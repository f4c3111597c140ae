package opstore

import (
	"context"
	"fmt"
)

// Ticket is a claimed op key whose dispatch is durable. Exactly one Finish
// must follow; until then a request with the same key is a conflict.
type Ticket struct {
	s    *Store     // the single-machine store, or
	e    *EtcdStore // the etcd store
	in   Intent
	seg  uint64
	rev  int64  // etcd: the mod revision of the intent's put
	tok  uint64 // etcd: the fencing token the intent was recorded under
	done bool
}

// Intent returns the durable intent, with DispatchedAt and RetainUntil set.
func (t *Ticket) Intent() Intent { return t.in }

// Token returns the fencing token the intent was recorded under: the
// revision of the session's owner key in etcd (EtcdStore.Claim). The
// single-machine store fences nothing across machines and returns 0.
func (t *Ticket) Token() uint64 { return t.tok }

// checkFinish refuses a result Finish cannot record.
func (t *Ticket) checkFinish(r *Receipt) error {
	if r.Outcome == Dispatched || !r.Outcome.Valid() {
		return fmt.Errorf("%w: finish op key %s with outcome %q", ErrInvalid, t.in.OpKey, r.Outcome)
	}
	if r.Response == nil && r.Error == nil && r.Outcome != Interrupted {
		return fmt.Errorf("%w: finish op key %s without a response or an error", ErrInvalid, t.in.OpKey)
	}
	return nil
}

// Finish records the result of the dispatched request and releases the
// key: later requests with the key are answered from r. The identity
// fields of r (key, digest, method, session, tuple, principal, lease,
// dispatch and retention times) are taken from the intent; r.Outcome must
// be final or Pending. The result reaches bbolt behind the caller, in
// order; a crash before that turns the key Interrupted, never re-run.
//
// On an EtcdStore, Finish is one transaction that checks the session is
// still this store's (the fencing token); a fenced Finish records nothing
// and returns ErrFenced: the new owner has made the key interrupted.
func (t *Ticket) Finish(r *Receipt) error {
	if err := t.checkFinish(r); err != nil {
		return err
	}
	if t.e != nil {
		return t.e.finish(t, r)
	}
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.done {
		return fmt.Errorf("%w: op key %s finished twice", ErrInvalid, t.in.OpKey)
	}
	t.done = true
	delete(s.inflight, t.in.key())
	rec := *r
	stamp(&rec, &t.in)
	if rec.CompletedAt == nil {
		now := s.opts.Now().UTC()
		rec.CompletedAt = &now
	}
	s.putLocked(t.in.key(), &rec, 0)
	return s.werr
}

// stamp copies the identity fields of in into r.
func stamp(r *Receipt, in *Intent) {
	r.OpKey, r.RequestSHA256, r.Method = in.OpKey, in.RequestSHA256, in.Method
	r.SessionID, r.TupleSHA256, r.Principal = in.SessionID, in.TupleSHA256, in.Principal
	r.LeaseNotAfter, r.DispatchedAt, r.RetainUntil = in.LeaseNotAfter, in.DispatchedAt, in.RetainUntil
	r.TaggedBy = in.TaggedBy
}

// Complete moves the Pending receipt of store key key (Key: an exec whose
// exit was not yet observed) to its final outcome; fn fills in the
// outcome, exit and file checks. The response replayed to a retry never changes. Completing a
// receipt that is already final is an error wrapping ErrInvalid.
func (s *Store) Complete(ctx context.Context, key string, fn func(r *Receipt)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	r, err := s.lookupLocked(key)
	if err != nil {
		return err
	}
	if r.Outcome != Pending {
		return fmt.Errorf("%w: op key %s is %s, not pending", ErrInvalid, key, r.Outcome)
	}
	next := *r
	fn(&next)
	next.OpKey, next.RequestSHA256, next.Response = r.OpKey, r.RequestSHA256, r.Response
	if !next.Outcome.Final() {
		return fmt.Errorf("%w: complete op key %s with non-final outcome %q", ErrInvalid, key, next.Outcome)
	}
	now := s.opts.Now().UTC()
	next.CompletedAt = &now
	s.putLocked(key, &next, 0)
	return nil
}

// Get returns the stored bytes of the receipt of store key key (Key),
// exactly as stored.
func (s *Store) Get(key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	data, err := s.rawLocked(key)
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), data...), nil
}

// List returns every receipt the store holds, including those still
// queued for bbolt, in no particular order.
func (s *Store) List() ([]*Receipt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	byKey, err := readBucket(s.db)
	if err != nil {
		return nil, err
	}
	for k, c := range s.cache {
		r, err := Unmarshal(c.data)
		if err != nil {
			return nil, err
		}
		byKey[k] = r
	}
	out := make([]*Receipt, 0, len(byKey))
	for _, r := range byKey {
		out = append(out, r)
	}
	return out, nil
}
