package opstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The store's ownership lease. Every owner key the store writes is bound
// to it, and the store's claims hold while it lives. It is lost when its
// keepalive fails for longer than its TTL (etcd unreachable from this
// process through member restarts or a partition, a frozen process), or
// when etcd answers that it is gone. A lost lease is never used again:
// Begin refuses at once (ErrFenced), and the next Claim (which WaitClaim
// runs) grants a new lease, revokes the lost one in case etcd still keeps
// it, and claims the session afresh under a new token. That claim runs
// the takeover, so every key left in flight under the lost lease, this
// store's own included, becomes Interrupted and is never dispatched again.

// grantLease grants a lease of ttl (rounded up to whole seconds) and keeps
// it alive until the returned session is closed or orphaned.
func grantLease(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (*concurrency.Session, error) {
	secs := int64((ttl + time.Second - 1) / time.Second)
	lease, err := cli.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("%w: grant the ownership lease: %w", ErrUnavailable, err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(secs)))
	if err != nil {
		return nil, fmt.Errorf("%w: keep the ownership lease alive: %w", ErrUnavailable, err)
	}
	return sess, nil
}

// ended reports whether sess no longer renews its lease.
func ended(sess *concurrency.Session) bool {
	select {
	case <-sess.Done():
		return true
	default:
		return false
	}
}

// session returns the store's current lease session.
func (s *EtcdStore) session() *concurrency.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess
}

// liveLease returns the store's lease if it is alive. A lost one is
// replaced: a new lease is granted, every claim made under the lost one
// is dropped, and the lost one is revoked (best effort: if etcd does not
// answer, nothing renews it and it expires within its TTL).
func (s *EtcdStore) liveLease(ctx context.Context) (*concurrency.Session, error) {
	s.renew.Lock()
	defer s.renew.Unlock()
	s.mu.Lock()
	cur, closed := s.sess, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return nil, ErrClosed
	case !ended(cur):
		return cur, nil
	}
	next, err := grantLease(ctx, s.cli, s.opts.LeaseTTL)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = next.Close()
		return nil, ErrClosed
	}
	s.sess, s.owned = next, map[string]uint64{}
	s.mu.Unlock()
	s.revokeLost(cur)
	return next, nil
}

// dropLease marks sess lost after etcd answered that its lease is gone:
// its keepalive stops and the next liveLease replaces it.
func (s *EtcdStore) dropLease(sess *concurrency.Session) { sess.Orphan() }

// revokeLost revokes a lost lease, so owner keys etcd may still keep for
// it (its keepalive failed, yet a leader change refreshed it) go at once
// instead of after its TTL.
func (s *EtcdStore) revokeLost(sess *concurrency.Session) {
	sess.Orphan()
	ctx, cancel := s.reqCtx()
	defer cancel()
	_, _ = s.cli.Revoke(ctx, sess.Lease())
}

// claimOwner creates the session's owner key under a live lease and
// returns its token and the lease it is bound to. A lease etcd no longer
// knows (it expired before this process noticed) is replaced once.
func (s *EtcdStore) claimOwner(ctx context.Context, sid string) (uint64, *concurrency.Session, error) {
	for try := 0; ; try++ {
		sess, err := s.liveLease(ctx)
		if err != nil {
			return 0, nil, err
		}
		tok, err := s.createOwner(ctx, sid, sess)
		if try == 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.dropLease(sess)
			continue
		}
		return tok, sess, err
	}
}

// record notes the claim of sid under sess, unless sess was lost and
// replaced meanwhile (then the claim is void: etcd deleted the owner key
// with the lease, or will).
func (s *EtcdStore) record(sid string, tok uint64, sess *concurrency.Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess != sess {
		return fmt.Errorf("%w: session %q: the ownership lease was lost during the claim", ErrFenced, sid)
	}
	s.owned[sid] = tok
	return nil
}
