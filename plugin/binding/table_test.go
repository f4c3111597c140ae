package binding

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

func tu(owner string) admission.Tuple {
	return admission.Tuple{Owner: owner, Allocation: "a", Session: "s", Workspace: "w", Sandbox: "x",
		Generation: 1, Executor: "e", Site: "t", Root: "/r"}
}

func admitAll(ctx context.Context, sid, sha string) (time.Time, uint64, error) {
	return time.Now().Add(time.Hour), 1, nil
}

func open(t *Table, conn, sid, who string, m contract.Method, meta map[string]any) (contract.Status, error) {
	return t.Open(context.Background(), OpenRequest{ConnID: conn, SessionID: sid, Principal: who, Method: m, Meta: meta, Attach: admitAll})
}

func bindMeta(x admission.Tuple) map[string]any {
	return acpmeta.Bind{Tuple: x, LeaseNotAfter: time.Now().Add(time.Hour)}.Meta()
}

// TestStaleFenceDoesNotUndoReattach: a failure from before a reattach must
// not fence the new binding (epochs).
func TestStaleFenceDoesNotUndoReattach(t *testing.T) {
	tb := New(nil)
	if _, err := open(tb, "c1", "s", "alice", contract.MethodNew, bindMeta(tu("alice"))); err != nil {
		t.Fatal(err)
	}
	old, err := tb.Authorize("c1", "s")
	if err != nil {
		t.Fatal(err)
	}
	tb.Disconnect("c1")
	if _, err := open(tb, "c2", "s", "alice", contract.MethodLoad, bindMeta(tu("alice"))); err != nil {
		t.Fatal(err)
	}
	tb.Fence(old, errcode.CodeTupleMismatch, "stale")
	if _, err := tb.Authorize("c2", "s"); err != nil {
		t.Fatalf("stale fence undid the reattach: %v", err)
	}
	if err := tb.Check(old); err == nil {
		t.Fatal("old grant still checks")
	}
}

// TestAttachTransportErrorFences: a bind whose attach fails leaves a
// never-bound session pending and a bound one fenced.
func TestAttachFailureStates(t *testing.T) {
	tb := New(nil)
	fail := func(ctx context.Context, sid, sha string) (time.Time, uint64, error) {
		return time.Time{}, 0, errcode.Errorf(errcode.CodeFateUnknown, "lost")
	}
	req := OpenRequest{ConnID: "c", SessionID: "s", Principal: "alice", Method: contract.MethodNew, Meta: bindMeta(tu("alice")), Attach: fail}
	st, err := tb.Open(context.Background(), req)
	var we *errcode.Error
	if !errors.As(err, &we) || we.Code != errcode.CodeFateUnknown || st.State != contract.Pending {
		t.Fatalf("first attach lost: %v %v", st.State, err)
	}
	req.Method, req.Attach = contract.MethodLoad, admitAll
	if st, err := tb.Open(context.Background(), req); err != nil || st.State != contract.Bound {
		t.Fatalf("bind: %v %v", st.State, err)
	}
	req.Attach = fail
	if st, _ := tb.Open(context.Background(), req); st.State != contract.Fenced {
		t.Fatalf("failed reattach of a bound session: %v", st.State)
	}
}

// TestConcurrentUse exercises the table from many goroutines (run -race).
func TestConcurrentUse(t *testing.T) {
	tb := New(nil)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			conn := []string{"c1", "c2"}[i%2]
			for j := 0; j < 50; j++ {
				_, _ = open(tb, conn, "s", "alice", contract.MethodLoad, bindMeta(tu("alice")))
				if g, err := tb.Authorize(conn, "s"); err == nil {
					tb.Fence(g, errcode.CodeFenced, "x")
				}
				_ = tb.Policy(conn, "s", contract.HostFilesystem)
				if j%10 == 0 {
					tb.Disconnect(conn)
				}
			}
		}(i)
	}
	wg.Wait()
	if err := tb.Policy("c1", "s", contract.HostProcess); err == nil {
		t.Fatal("bound-scope session allowed a host tool")
	}
}

// TestStatusFencesPassedLease: Status never reports Bound once the lease
// has passed; it fences the session as Authorize would (lease_expired),
// before any tool call, and the fence is sticky. Another principal's read
// is refused and changes nothing.
func TestStatusFencesPassedLease(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	tb := New(clock)
	if _, err := open(tb, "c1", "s", "alice", contract.MethodNew, bindMeta(tu("alice"))); err != nil {
		t.Fatal(err)
	}
	if st, err := tb.Status("alice", "s"); err != nil || st.State != contract.Bound {
		t.Fatalf("status with a current lease: %v %v", st.State, err)
	}
	mu.Lock()
	now = now.Add(2 * time.Hour) // past both the meta's and attach's lease
	mu.Unlock()
	var we *errcode.Error
	if _, err := tb.Status("bob", "s"); !errors.As(err, &we) || we.Code != errcode.CodeDenied {
		t.Fatalf("another principal's status: %v", err)
	}
	if tb.sessions["s"].fenced {
		t.Fatal("another principal's read fenced the session")
	}
	st, err := tb.Status("alice", "s")
	if err != nil || st.State != contract.Fenced || st.Code != errcode.CodeLeaseExpired || st.Message != "lease ended at "+rfc3339(st.LeaseNotAfter) {
		t.Fatalf("status after the lease: %v %q %q %v", st.State, st.Code, st.Message, err)
	}
	if _, err := tb.Authorize("c1", "s"); !errors.As(err, &we) || we.Code != errcode.CodeFenced {
		t.Fatalf("tool after Status fenced the lease: %v", err)
	}
}
