package opstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/fixtures/etcdtest"
)

var prefixSeq atomic.Int64

// freshPrefix gives each store test its own namespace in the cluster.
func freshPrefix(t *testing.T) string {
	return fmt.Sprintf("/test/%s/%d/", strings.ReplaceAll(t.Name(), "/", "_"), prefixSeq.Add(1))
}

// openEtcd opens an EtcdStore named name under prefix, closed at cleanup.
func openEtcd(t *testing.T, cli *clientv3.Client, prefix, name string, o Options) *EtcdStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenEtcd(ctx, EtcdOptions{Client: cli, Prefix: prefix, Name: name, LeaseTTL: 2 * time.Second,
		Retention: o.Retention, PruneEvery: o.PruneEvery, Now: o.Now})
	if err != nil {
		t.Fatalf("OpenEtcd: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// claimT claims sid or fails the test.
func claimT(t *testing.T, s *EtcdStore, sid string) Claimed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.WaitClaim(ctx, sid)
	if err != nil {
		t.Fatalf("claim %s: %v", sid, err)
	}
	return c
}

// etcdBackend opens a store that owns sess-1 (the session of intent());
// reopen closes it (revoking its lease, as a handover does) and has a
// second custodian claim the session.
func etcdBackend(cli *clientv3.Client) func(t *testing.T, o Options) backend {
	return func(t *testing.T, o Options) backend {
		prefix := freshPrefix(t)
		s := openEtcd(t, cli, prefix, "custodian-a", o)
		claimT(t, s, "sess-1")
		return backend{keys: s, reopen: func(t *testing.T) Keys {
			s.Close()
			s2 := openEtcd(t, cli, prefix, "custodian-b", o)
			claimT(t, s2, "sess-1")
			return s2
		}}
	}
}

// TestIntegrationEtcdContract runs the op-key contract the bbolt store
// keeps against the etcd store on a real 3-member cluster.
func TestIntegrationEtcdContract(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	open := etcdBackend(cli)
	for name, f := range map[string]func(*testing.T, backend){
		"replay":       contractReplay,
		"conflict":     contractConflict,
		"duplicate":    contractConcurrentDuplicate,
		"pending":      contractPendingCompletes,
		"idempotent":   contractIdempotent,
		"fate_unknown": contractFateUnknownIsInterrupted,
		"scoped_keys":  contractScopedKeys,
	} {
		t.Run(name, func(t *testing.T) { f(t, open(t, Options{})) })
	}
	t.Run("keep_for_lease", func(t *testing.T) { contractKeepForLease(t, open) })
}

// TestIntegrationEtcdFencing: custodian A owns a session and has a key in
// flight; its lease ends as etcd sees it (revoked behind its back, as an
// expiry during a partition looks); B claims the session. B's token is
// higher, A's in-flight key is Interrupted for B, and everything A writes
// afterwards (the result of its key, a new intent, a binding) is refused
// with ErrFenced and leaves no trace, although A's process still believes
// it owns the session.
func TestIntegrationEtcdFencing(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	prefix := freshPrefix(t)
	a, b := openEtcd(t, cli, prefix, "a", Options{}), openEtcd(t, cli, prefix, "b", Options{})
	ca := claimT(t, a, "sess-1")
	if _, err := b.Claim(ctx, "sess-1"); !errors.Is(err, ErrOwned) {
		t.Fatalf("B claimed a session A owns: %v, want ErrOwned", err)
	}
	tk, _, err := a.Begin(ctx, intent("k1", "r"))
	if err != nil {
		t.Fatal(err)
	}
	if tk.Token() != ca.Token {
		t.Fatalf("ticket token %d, claim token %d", tk.Token(), ca.Token)
	}
	if _, err := cli.Revoke(ctx, a.Lease()); err != nil {
		t.Fatal(err)
	}
	cb := claimT(t, b, "sess-1")
	if cb.Token <= ca.Token || len(cb.Interrupted) != 1 || cb.Interrupted[0] != "k1" {
		t.Fatalf("takeover = %+v (A's token %d); want a higher token and k1 interrupted", cb, ca.Token)
	}
	if err := tk.Finish(&Receipt{Outcome: Verified, Response: []byte(`{"late":true}`)}); !errors.Is(err, ErrFenced) {
		t.Fatalf("A's late Finish: %v, want ErrFenced", err)
	}
	believe(t, cli, a, "sess-1", ca.Token) // A believes it still owns the session, on a live lease
	if tk, _, err := a.Begin(ctx, intent("k2", "r")); tk != nil || !errors.Is(err, ErrFenced) {
		t.Fatalf("A's Begin after the takeover = %v, %v; want ErrFenced", tk, err)
	}
	if _, err := b.Get(testKey("k2")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a fenced Begin left a record: %v", err)
	}
	_, r, err := b.Begin(ctx, intent("k1", "r"))
	if err != nil || r == nil || r.Outcome != Interrupted || strings.Contains(string(r.Response), "late") {
		t.Fatalf("retry of k1 at B = %+v, %v; want the interrupted receipt", r, err)
	}
	if _, _, err := b.Begin(ctx, intent("k1", "other")); !errors.Is(err, ErrConflict) {
		t.Fatalf("k1 with other arguments at B: %v, want op_key_conflict", err)
	}
}

// TestIntegrationEtcdBindingSurvivesTakeover: the binding the owner
// recorded is what the standby's claim returns; a binding whose digest is
// not its tuple's is refused.
func TestIntegrationEtcdBindingSurvivesTakeover(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	prefix := freshPrefix(t)
	a, b := openEtcd(t, cli, prefix, "a", Options{}), openEtcd(t, cli, prefix, "b", Options{})
	claimT(t, a, "sess-1")
	tu := admission.Tuple{Owner: "alice", Allocation: "a1", Session: "s1", Workspace: "w1", Sandbox: "sb1",
		Generation: 1, Executor: "e1", Site: "local", Root: "/srv/tether/w1"}
	rec := BindingRecord{SessionID: "sess-1", Tuple: tu, TupleSHA256: tu.SHA256(),
		LeaseNotAfter: time.Now().Add(time.Hour).UTC().Truncate(time.Second), Principal: "alice"}
	bad := rec
	bad.TupleSHA256 = digest("other")
	if err := a.PutBinding(ctx, bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("binding with a foreign digest: %v, want ErrInvalid", err)
	}
	if err := a.PutBinding(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := b.PutBinding(ctx, rec); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("binding by a non-owner: %v, want ErrNotClaimed", err)
	}
	a.Close()
	cb := claimT(t, b, "sess-1")
	if cb.Binding == nil || *cb.Binding != rec {
		t.Fatalf("standby's claim binding = %+v, want %+v", cb.Binding, rec)
	}
}

// believe makes s believe it owns sid under tok on a live lease of its
// own, so that only etcd's compare stands between its writes and the
// store (s's local lease check would refuse them first).
func believe(t *testing.T, cli *clientv3.Client, s *EtcdStore, sid string, tok uint64) {
	t.Helper()
	live, err := grantLease(context.Background(), cli, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Close() })
	s.mu.Lock()
	s.sess, s.owned[sid] = live, tok
	s.mu.Unlock()
}
