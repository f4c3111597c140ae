package opstore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// EtcdOptions configure an EtcdStore.
type EtcdOptions struct {
	// Client reaches the etcd cluster. Required; the caller closes it
	// after the store.
	Client *clientv3.Client
	// Prefix is the root of every key the store writes. Zero means
	// DefaultEtcdPrefix. Custodians that may take each other's sessions
	// over must share it.
	Prefix string
	// Name identifies this custodian in the owner keys it writes (for
	// people reading etcd and OwnedError). Required.
	Name string
	// LeaseTTL is the ownership lease: a custodian that stops renewing it
	// (dead, frozen, partitioned) loses every session this long after its
	// last renewal, and a standby may then claim them. Rounded up to whole
	// seconds. Zero means 10 s. A store that loses its own lease this way
	// acts on none of its sessions until it claims them again (WaitClaim).
	LeaseTTL time.Duration
	// RequestTimeout bounds each etcd request the store makes without a
	// caller's context (Get, List, Finish, Close). Zero means 5 s.
	RequestTimeout time.Duration
	// Retention, PruneEvery and Now mean what they mean in Options.
	Retention  time.Duration
	PruneEvery time.Duration
	Now        func() time.Time
}

// DefaultEtcdPrefix is the default root of the store's keys.
const DefaultEtcdPrefix = "/tether/opstore/"

func (o *EtcdOptions) fill() error {
	switch {
	case o.Client == nil:
		return fmt.Errorf("%w: an etcd client is required", ErrInvalid)
	case o.Name == "":
		return fmt.Errorf("%w: the custodian's name is required", ErrInvalid)
	}
	if o.Prefix == "" {
		o.Prefix = DefaultEtcdPrefix
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 10 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 5 * time.Second
	}
	base := Options{Retention: o.Retention, PruneEvery: o.PruneEvery, Now: o.Now}
	if err := base.fill(); err != nil {
		return err
	}
	o.Retention, o.PruneEvery, o.Now = base.Retention, base.PruneEvery, base.Now
	return nil
}

// EtcdStore keeps operation keys, receipts, session bindings and session
// ownership in etcd, so that any custodian sharing the prefix can answer
// a retry and take a session over from a custodian that died.
//
// A custodian owns a session through a key bound to its etcd lease
// (Claim). Every intent and receipt is written in a transaction that
// compares that key's create revision with the token Claim returned: once
// the lease has expired or another custodian has claimed the session, the
// write is refused (ErrFenced) and nothing is recorded. The token is the
// fencing token the wire protocol will carry to the receiver.
//
// When the store's own lease is lost (its keepalive failed for longer
// than the TTL), Begin refuses every session with ErrFenced and the store
// records nothing new under it; WaitClaim then grants a new lease and
// claims the session again, interrupting what was in flight (etcd_lease.go).
//
// Close must be called; it revokes the lease, which releases every
// session this store owns at once. All methods are safe for concurrent
// use.
type EtcdStore struct {
	cli  *clientv3.Client
	opts EtcdOptions

	renew sync.Mutex // one lease renewal at a time (liveLease)

	mu     sync.Mutex
	sess   *concurrency.Session // the current lease; replaced when lost
	owned  map[string]uint64    // session id -> fencing token, under sess
	closed bool
	stop   chan struct{}
	done   chan struct{}
}

// OpenEtcd grants the store's lease (kept alive until Close) and starts
// its pruner. ctx bounds the grant.
func OpenEtcd(ctx context.Context, opts EtcdOptions) (*EtcdStore, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	sess, err := grantLease(ctx, opts.Client, opts.LeaseTTL)
	if err != nil {
		return nil, err
	}
	s := &EtcdStore{cli: opts.Client, opts: opts, sess: sess, owned: map[string]uint64{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go s.pruner()
	return s, nil
}

// Key layout under the prefix. Session ids are base64url-encoded so no id
// can reach into another session's keys.
// opKey is the etcd key of store key k (Key: scoped per binding).
func (s *EtcdStore) opKey(k string) string { return s.opts.Prefix + "ops/" + k }
func (s *EtcdStore) sessKey(sid string) string {
	return s.opts.Prefix + "sessions/" + base64.RawURLEncoding.EncodeToString([]byte(sid))
}
func (s *EtcdStore) ownerKey(sid string) string   { return s.sessKey(sid) + "/owner" }
func (s *EtcdStore) bindingKey(sid string) string { return s.sessKey(sid) + "/binding" }
func (s *EtcdStore) openPrefix(sid string) string { return s.sessKey(sid) + "/open/" }
func (s *EtcdStore) leaseKey(tuple string) string { return s.opts.Prefix + "leases/" + tuple }

// owner is the value of an owner key.
type owner struct {
	Name      string    `json:"name"`
	Lease     string    `json:"lease"`
	ClaimedAt time.Time `json:"claimed_at"`
}

// Lease returns the store's current etcd lease, which every owner key it
// writes is bound to (a new one after a lost lease was replaced).
func (s *EtcdStore) Lease() clientv3.LeaseID { return s.session().Lease() }

// Lost is closed when the store's current ownership lease has ended
// (expired while etcd was unreachable or this process was frozen, or
// revoked): every session it owned may have been claimed by another
// custodian, and its writes are refused (ErrFenced). A lease granted
// later (WaitClaim replaces a lost one) has a channel of its own.
func (s *EtcdStore) Lost() <-chan struct{} { return s.session().Done() }

// Token returns the fencing token of a session this store claimed:
// the create revision of its owner key. It fails with ErrNotClaimed for a
// session never claimed, and ErrFenced once the lease is lost (WaitClaim
// claims the session again under a new lease).
func (s *EtcdStore) Token(sessionID string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokenLocked(sessionID)
}

// claimed returns the token this store claimed sid with. Unlike Token it
// does not look at the local lease state: the fencing is etcd's compare
// in every write, which holds whatever this process believes. It serves
// the writes that record what happened (results, completions, bindings);
// a new dispatch (Begin) also refuses under a lease this process lost.
func (s *EtcdStore) claimed(sid string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	tok, ok := s.owned[sid]
	if !ok {
		return 0, fmt.Errorf("%w: session %q", ErrNotClaimed, sid)
	}
	return tok, nil
}

func (s *EtcdStore) tokenLocked(sid string) (uint64, error) {
	if s.closed {
		return 0, ErrClosed
	}
	tok, ok := s.owned[sid]
	if !ok {
		return 0, fmt.Errorf("%w: session %q", ErrNotClaimed, sid)
	}
	select {
	case <-s.sess.Done():
		return 0, fmt.Errorf("%w: session %q: the ownership lease is lost", ErrFenced, sid)
	default:
	}
	return tok, nil
}

// ownedBy is the compare every fenced write carries.
func (s *EtcdStore) ownedBy(sid string, tok uint64) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.ownerKey(sid)), "=", int64(tok))
}

// fenced records that sid is no longer this store's and returns the error.
func (s *EtcdStore) fenced(sid string, tok uint64) error {
	s.mu.Lock()
	if s.owned[sid] == tok {
		delete(s.owned, sid)
	}
	s.mu.Unlock()
	return fmt.Errorf("%w: session %q (token %d)", ErrFenced, sid, tok)
}

// reqCtx bounds a request made without a caller's context.
func (s *EtcdStore) reqCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.opts.RequestTimeout)
}

// unavailable wraps an etcd error whose outcome is unknown.
func unavailable(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}

// Begin records the intent in one transaction that checks the session is
// this store's and the key is new. It returns a Ticket (dispatch, then
// Finish), the stored receipt (a replay), or an error: a *ConflictError,
// ErrFenced (the session was taken over, or this store's lease is lost:
// dispatch nothing, and WaitClaim before anything else), ErrNotClaimed
// (never claimed, or dropped with a lost lease: WaitClaim too), or
// ErrUnavailable (etcd did not answer; dispatch nothing).
//
// The local lease check comes first: once this process's keepalive has
// failed, the lease will lapse whatever etcd says now, so nothing is
// dispatched under it. etcd's compare is the check that holds regardless.
func (s *EtcdStore) Begin(ctx context.Context, in Intent) (*Ticket, *Receipt, error) {
	if err := stampIntent(ctx, &in, s.opts.Now(), s.opts.Retention); err != nil {
		return nil, nil, err
	}
	tok, err := s.Token(in.SessionID)
	if err != nil {
		return nil, nil, err
	}
	data, err := dispatchedReceipt(&in).Marshal()
	if err != nil {
		return nil, nil, err
	}
	k := s.opKey(in.key())
	resp, err := s.cli.Txn(ctx).
		If(s.ownedBy(in.SessionID, tok), clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(data)), clientv3.OpPut(s.openPrefix(in.SessionID)+in.key(), "")).
		Else(clientv3.OpGet(s.ownerKey(in.SessionID)), clientv3.OpGet(k)).Commit()
	if err != nil {
		s.undoBegin(in, tok, data)
		return nil, nil, unavailable("record dispatch of op key "+in.OpKey, err)
	}
	if resp.Succeeded {
		return &Ticket{e: s, in: in, rev: resp.Header.Revision, tok: tok}, nil, nil
	}
	return s.beginRefused(resp, &in, tok)
}

// BeginIdempotent is Begin: in etcd every claim is one fenced transaction,
// so an idempotent request is recorded like any other.
func (s *EtcdStore) BeginIdempotent(ctx context.Context, in Intent) (*Ticket, *Receipt, error) {
	return s.Begin(ctx, in)
}

// beginRefused explains a Begin transaction whose compares failed.
func (s *EtcdStore) beginRefused(resp *clientv3.TxnResponse, in *Intent, tok uint64) (*Ticket, *Receipt, error) {
	own := resp.Responses[0].GetResponseRange().Kvs
	if len(own) == 0 || uint64(own[0].CreateRevision) != tok {
		return nil, nil, s.fenced(in.SessionID, tok)
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 { // cannot happen: the key compare failed
		return nil, nil, fmt.Errorf("%w: op key %s refused and not found", ErrCorrupt, in.OpKey)
	}
	prev, err := Unmarshal(kvs[0].Value)
	if err != nil {
		return nil, nil, err
	}
	replay, err := answerStored(prev, in)
	return nil, replay, err
}

// undoBegin runs after a Begin whose transaction may or may not have been
// applied (etcd did not answer): the request is not dispatched, so if the
// intent did land it is turned into a Failed "not sent" receipt, provided
// it is still exactly what this Begin wrote. If that fails too, the key
// stays Dispatched and becomes Interrupted when the session is next
// claimed: never replayed.
func (s *EtcdStore) undoBegin(in Intent, tok uint64, data []byte) {
	r := dispatchedReceipt(&in)
	now := s.opts.Now().UTC()
	r.Outcome, r.CompletedAt, r.Note = Failed, &now, "not sent: etcd did not confirm the intent"
	r.Error = &ResultError{Code: "unavailable", Message: "the op store did not confirm the intent; nothing was sent"}
	fail, err := r.Marshal()
	if err != nil {
		return
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	k := s.opKey(in.key())
	_, _ = s.cli.Txn(ctx).
		If(s.ownedBy(in.SessionID, tok), clientv3.Compare(clientv3.Value(k), "=", string(data))).
		Then(clientv3.OpPut(k, string(fail)), clientv3.OpDelete(s.openPrefix(in.SessionID)+in.key())).Commit()
}

// finish records a ticket's result, fenced by the ticket's token and by
// the intent's own revision (a takeover that interrupted the key has
// changed it).
func (s *EtcdStore) finish(t *Ticket, r *Receipt) error {
	s.mu.Lock()
	if t.done {
		s.mu.Unlock()
		return fmt.Errorf("%w: op key %s finished twice", ErrInvalid, t.in.OpKey)
	}
	t.done = true
	s.mu.Unlock()
	rec := *r
	stamp(&rec, &t.in)
	if rec.CompletedAt == nil {
		now := s.opts.Now().UTC()
		rec.CompletedAt = &now
	}
	return s.putFenced(t.in.SessionID, t.tok, t.in.key(), t.rev, &rec)
}

// putFenced writes r over key if the session is still owned under tok and
// the key is still at rev; a final receipt leaves the session's open set.
func (s *EtcdStore) putFenced(sid string, tok uint64, key string, rev int64, r *Receipt) error {
	data, err := r.Marshal()
	if err != nil {
		return err
	}
	ops := []clientv3.Op{clientv3.OpPut(s.opKey(key), string(data))}
	if r.Outcome.Final() {
		ops = append(ops, clientv3.OpDelete(s.openPrefix(sid)+key))
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	resp, err := s.cli.Txn(ctx).
		If(s.ownedBy(sid, tok), clientv3.Compare(clientv3.ModRevision(s.opKey(key)), "=", rev)).
		Then(ops...).Commit()
	if err != nil {
		return unavailable("record the result of op key "+key, err)
	}
	if !resp.Succeeded {
		return s.fenced(sid, tok)
	}
	return nil
}

// Complete moves a Pending receipt to its final outcome, fenced like
// Finish: only the session's current owner completes it.
func (s *EtcdStore) Complete(ctx context.Context, key string, fn func(r *Receipt)) error {
	r, rev, err := s.read(ctx, key)
	if err != nil {
		return err
	}
	if r.Outcome != Pending {
		return fmt.Errorf("%w: op key %s is %s, not pending", ErrInvalid, key, r.Outcome)
	}
	tok, err := s.claimed(r.SessionID)
	if err != nil {
		return err
	}
	next := *r
	fn(&next)
	next.OpKey, next.RequestSHA256, next.Response = r.OpKey, r.RequestSHA256, r.Response
	if !next.Outcome.Final() {
		return fmt.Errorf("%w: complete op key %s with non-final outcome %q", ErrInvalid, key, next.Outcome)
	}
	now := s.opts.Now().UTC()
	next.CompletedAt = &now
	return s.putFenced(r.SessionID, tok, key, rev, &next)
}

// read returns key's receipt and its mod revision.
func (s *EtcdStore) read(ctx context.Context, key string) (*Receipt, int64, error) {
	resp, err := s.cli.Get(ctx, s.opKey(key))
	if err != nil {
		return nil, 0, unavailable("read op key "+key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	r, err := Unmarshal(resp.Kvs[0].Value)
	return r, resp.Kvs[0].ModRevision, err
}

// Get returns the stored bytes of key's receipt, exactly as stored (a
// linearizable read, bounded by RequestTimeout).
func (s *EtcdStore) Get(key string) ([]byte, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	resp, err := s.cli.Get(ctx, s.opKey(key))
	if err != nil {
		return nil, unavailable("read op key "+key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return resp.Kvs[0].Value, nil
}

// List returns every receipt under the prefix, in no particular order.
func (s *EtcdStore) List() ([]*Receipt, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	resp, err := s.cli.Get(ctx, s.opKey(""), clientv3.WithPrefix())
	if err != nil {
		return nil, unavailable("list op keys", err)
	}
	out := make([]*Receipt, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		r, err := Unmarshal(kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Flush returns at once: every EtcdStore write is committed to a quorum
// before the call that made it returns.
func (s *EtcdStore) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.usable()
}

func (s *EtcdStore) usable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// Close stops the pruner and revokes the lease, which deletes every owner
// key this store holds: a standby may claim its sessions at once, and
// their keys still in flight become Interrupted then. Close is safe to
// call twice.
func (s *EtcdStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sess := s.sess
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	err := sess.Close()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("op store: revoke the ownership lease: %w", err)
	}
	return nil
}

// marshalOwner encodes this store's owner value under sess.
func (s *EtcdStore) marshalOwner(sess *concurrency.Session) string {
	data, _ := json.Marshal(owner{Name: s.opts.Name, Lease: fmt.Sprintf("%x", int64(sess.Lease())),
		ClaimedAt: s.opts.Now().UTC()})
	return string(data)
}
