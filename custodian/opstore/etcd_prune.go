package opstore

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherdev/tether/admission/acpmeta"
)

// KeepForLease records in etcd that the tuple's lease now ends at
// notAfter (never earlier than what is recorded), so no custodian prunes
// its keys before notAfter plus the retention. It is a compare-and-swap
// on the tuple's lease key, not fenced by a session: it can only lengthen
// retention.
func (s *EtcdStore) KeepForLease(ctx context.Context, tupleSHA256 string, notAfter time.Time) error {
	if !acpmeta.ValidDigest(tupleSHA256) {
		return fmt.Errorf("%w: tuple digest is not a lowercase hex SHA-256", ErrInvalid)
	}
	if err := s.usable(); err != nil {
		return err
	}
	k := s.leaseKey(tupleSHA256)
	for range 16 {
		resp, err := s.cli.Get(ctx, k)
		if err != nil {
			return unavailable("read the lease of tuple "+tupleSHA256, err)
		}
		var rev int64
		if len(resp.Kvs) == 1 {
			rev = resp.Kvs[0].ModRevision
			if cur, ok := parseLeaseEnd(resp.Kvs[0].Value); ok && !notAfter.After(cur) {
				return nil
			}
		}
		txn, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
			Then(clientv3.OpPut(k, notAfter.UTC().Format(time.RFC3339Nano))).Commit()
		if err != nil {
			return unavailable("record the lease of tuple "+tupleSHA256, err)
		}
		if txn.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("%w: record the lease of tuple %s: too many concurrent updates", ErrUnavailable, tupleSHA256)
}

// parseLeaseEnd decodes a recorded lease end; one that does not decode
// reads as "forever", as in the bbolt store.
func parseLeaseEnd(v []byte) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, string(v))
	if err != nil {
		return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), true
	}
	return t, true
}

// Prune deletes final receipts whose retention (and their tuple's
// recorded lease plus the retention) has passed, each in a transaction
// that checks it did not change since it was read, then lease records
// that keep nothing any more. Any custodian sharing the prefix may prune.
func (s *EtcdStore) Prune(ctx context.Context) error {
	if err := s.usable(); err != nil {
		return err
	}
	now := s.opts.Now()
	leases, err := s.readLeases(ctx)
	if err != nil {
		return err
	}
	resp, err := s.cli.Get(ctx, s.opKey(""), clientv3.WithPrefix())
	if err != nil {
		return unavailable("list op keys to prune", err)
	}
	for _, kv := range resp.Kvs {
		r, err := Unmarshal(kv.Value)
		if err != nil || !r.Outcome.Final() || !now.After(s.retainUntil(leases, r)) {
			continue
		}
		k := string(kv.Key)
		if _, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(k)).Commit(); err != nil {
			return unavailable("prune op key "+r.OpKey, err)
		}
	}
	return s.pruneLeaseKeys(ctx, leases, now)
}

// readLeases returns every recorded lease end by tuple digest, with the
// revision each was read at.
func (s *EtcdStore) readLeases(ctx context.Context) (map[string]leaseEntry, error) {
	resp, err := s.cli.Get(ctx, s.leaseKey(""), clientv3.WithPrefix())
	if err != nil {
		return nil, unavailable("read lease records", err)
	}
	out := make(map[string]leaseEntry, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		end, _ := parseLeaseEnd(kv.Value)
		out[string(kv.Key[len(s.leaseKey("")):])] = leaseEntry{end: end, rev: kv.ModRevision}
	}
	return out, nil
}

type leaseEntry struct {
	end time.Time
	rev int64
}

func (s *EtcdStore) retainUntil(leases map[string]leaseEntry, r *Receipt) time.Time {
	until := r.RetainUntil
	if l, ok := leases[r.TupleSHA256]; ok {
		until = laterOf(until, l.end.Add(s.opts.Retention))
	}
	return until
}

func (s *EtcdStore) pruneLeaseKeys(ctx context.Context, leases map[string]leaseEntry, now time.Time) error {
	for tuple, l := range leases {
		if !now.After(l.end.Add(s.opts.Retention)) {
			continue
		}
		k := s.leaseKey(tuple)
		if _, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", l.rev)).
			Then(clientv3.OpDelete(k)).Commit(); err != nil {
			return unavailable("prune the lease record of tuple "+tuple, err)
		}
	}
	return nil
}

// pruner prunes every PruneEvery until Close. A failed round is retried
// at the next tick: pruning late keeps keys longer, never shorter.
func (s *EtcdStore) pruner() {
	defer close(s.done)
	t := time.NewTicker(s.opts.PruneEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), 4*s.opts.RequestTimeout)
			_ = s.Prune(ctx)
			cancel()
		}
	}
}
