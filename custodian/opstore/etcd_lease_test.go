package opstore

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tetherdev/tether/fixtures/etcdtest"
)

// openLongLease opens a store whose lease outlives the test (30 s), so
// that only what the test does to the lease can end it.
func openLongLease(t *testing.T, cli *clientv3.Client, prefix string) *EtcdStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenEtcd(ctx, EtcdOptions{Client: cli, Prefix: prefix, Name: "a", LeaseTTL: 30 * time.Second})
	if err != nil {
		t.Fatalf("OpenEtcd: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestIntegrationEtcdOwnLeaseLost: a custodian whose own ownership lease
// is lost while it has a key in flight acts on nothing under it, and gets
// the session back only through WaitClaim, whose takeover interrupts that
// key. Two ways to lose it:
//   - expired: etcd ends the lease behind the process's back (revoked
//     here, which is what an expiry while its keepalive could not reach
//     etcd looks like to it);
//   - keepalive_failed: the process stops renewing (its keepalive ended,
//     as after a TTL without an answer) while etcd still keeps the lease
//     and the owner key. Begin must refuse although etcd's compare would
//     pass, and WaitClaim must revoke the lost lease rather than wait for
//     it (its bound, 10 s, is shorter than the lease's 30 s TTL).
//
// In both, the late result of the in-flight key is refused, its retry
// gets the interrupted receipt, and a new key runs under the new token.
func TestIntegrationEtcdOwnLeaseLost(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	for name, lose := range map[string]func(t *testing.T, s *EtcdStore){
		"expired": func(t *testing.T, s *EtcdStore) {
			if _, err := cli.Revoke(context.Background(), s.Lease()); err != nil {
				t.Fatal(err)
			}
		},
		"keepalive_failed": func(t *testing.T, s *EtcdStore) { s.session().Orphan() },
	} {
		t.Run(name, func(t *testing.T) {
			s := openLongLease(t, cli, freshPrefix(t))
			ownLeaseLost(t, cli, s, func() { lose(t, s) }, name == "keepalive_failed")
		})
	}
}

func ownLeaseLost(t *testing.T, cli *clientv3.Client, s *EtcdStore, lose func(), ownerKeyKept bool) {
	ctx := context.Background()
	before := claimT(t, s, "sess-1")
	oldLease := s.Lease()
	tk, _, err := s.Begin(ctx, intent("k1", "r"))
	if err != nil {
		t.Fatal(err)
	}
	lose()
	if tk2, _, err := s.Begin(ctx, intent("k2", "r")); tk2 != nil || !errors.Is(err, ErrFenced) {
		t.Fatalf("Begin under the lost lease = %v, %v; want ErrFenced", tk2, err)
	}
	if _, err := s.Get(testKey("k2")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a Begin under the lost lease left a record: %v", err)
	}
	if ownerKeyKept {
		checkOwnerLease(t, cli, s, oldLease)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	after, err := s.WaitClaim(wctx, "sess-1")
	if err != nil {
		t.Fatalf("WaitClaim after the lease was lost: %v", err)
	}
	if after.Token <= before.Token || !slices.Equal(after.Interrupted, []string{"k1"}) || s.Lease() == oldLease {
		t.Fatalf("re-claim = %+v on lease %x (before: token %d on lease %x); want a higher token on a new lease, k1 interrupted",
			after, s.Lease(), before.Token, oldLease)
	}
	if err := tk.Finish(&Receipt{Outcome: Verified, Response: []byte(`{"late":true}`)}); !errors.Is(err, ErrFenced) {
		t.Fatalf("late Finish of the key begun under the lost lease: %v, want ErrFenced", err)
	}
	if tk, r, err := s.Begin(ctx, intent("k1", "r")); tk != nil || err != nil || r == nil || r.Outcome != Interrupted {
		t.Fatalf("retry of k1 = %v, %+v, %v; want its interrupted receipt", tk, r, err)
	}
	tk3, _, err := s.Begin(ctx, intent("k3", "r"))
	if err != nil || tk3.Token() != after.Token {
		t.Fatalf("Begin after the re-claim = %v, %v; want a ticket under token %d", tk3, err, after.Token)
	}
	if err := tk3.Finish(&Receipt{Outcome: Verified, Response: []byte(`{"ok":true}`)}); err != nil {
		t.Fatal(err)
	}
}

// checkOwnerLease fails t unless the session's owner key still exists
// under lease: etcd's own compare would still let its owner write.
func checkOwnerLease(t *testing.T, cli *clientv3.Client, s *EtcdStore, lease clientv3.LeaseID) {
	t.Helper()
	resp, err := cli.Get(context.Background(), s.ownerKey("sess-1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
		t.Fatalf("owner key = %v, want it kept under lease %x", resp.Kvs, lease)
	}
}
