package host_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/host"
)

// The binding rules of issue 5, one test each (SECURITY.md "Plugin:
// binding rules"). Every test runs the real plugin process.

func readOK(t *testing.T, l *link, sid string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(l.client.Root, "probe.txt"), []byte("probe"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := l.conn.ReadTextFile(ctxT(t), sid, host.CallOptions{}, "probe.txt", 0, 0); err != nil {
		t.Fatalf("tool in a bound session: %v", err)
	}
}

func readRefused(t *testing.T, l *link, sid, code string) {
	t.Helper()
	before := len(callsOf(l.client, "fs/read_text_file"))
	_, err := l.conn.ReadTextFile(ctxT(t), sid, host.CallOptions{}, "probe.txt", 0, 0)
	wantCode(t, err, code)
	if after := len(callsOf(l.client, "fs/read_text_file")); after != before {
		t.Fatalf("a refused tool still sent %d reads", after-before)
	}
}

func state(t *testing.T, l *link, sid string) host.BindingState {
	t.Helper()
	st, err := l.conn.Status(ctxT(t), sid)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}

// Rule 1: only `_meta["tether/bind"]` from the authenticated owner binds.
func TestRule1BindsOnlyThroughMetaFromTheOwner(t *testing.T) {
	p := loadPlugin(t)
	lease := time.Now().Add(time.Hour)
	l := newLink(t, p, newClient(t, lease), "alice")
	ctx, tu := ctxT(t), tuple("alice", l.client.Root)

	// No bind meta (the client may well advertise fs and terminal): unbound,
	// and the plugin's tools refuse.
	if _, err := l.conn.OpenSession(ctx, host.MethodNew, "plain", map[string]any{"other": 1}); err != nil {
		t.Fatal(err)
	}
	readRefused(t, l, "plain", "not_admitted")

	// The principal is the host's, never the meta's: bob cannot bind
	// alice's tuple, and a principal smuggled into the meta is refused.
	lb := newLink(t, p, l.client, "bob")
	_, err := lb.conn.OpenSession(ctx, host.MethodNew, "by-bob", bindMeta(t, tu, lease))
	wantCode(t, err, "denied")
	smuggled := bindMeta(t, tu, lease)
	smuggled[acpmeta.KeyBind].(map[string]any)["principal"] = "alice"
	_, err = lb.conn.OpenSession(ctx, host.MethodNew, "smuggled", smuggled)
	wantCode(t, err, "invalid")
	if n := len(callsOf(l.client, acpmeta.MethodAttach)); n != 0 {
		t.Fatalf("refused binds still called attach %d times", n)
	}

	if _, err := l.conn.OpenSession(ctx, host.MethodNew, "owned", bindMeta(t, tu, lease)); err != nil {
		t.Fatalf("owner bind: %v", err)
	}
	readOK(t, l, "owned")
}

// Rule 2: once a session asked to bind, tools are refused until a bind
// succeeds, even when the first admission failed.
func TestRule2IntentIsSticky(t *testing.T) {
	p := loadPlugin(t)
	lease := time.Now().Add(time.Hour)
	client := newClient(t, lease)
	admit := client.Attach
	client.Attach = func(context.Context, acpmeta.AttachRequest) (acpmeta.AttachResponse, error) {
		return acpmeta.AttachResponse{}, acperr.NewError(errcode.CodeNotAdmitted, "no grant yet")
	}
	l := newLink(t, p, client, "alice")
	ctx, tu := ctxT(t), tuple("alice", client.Root)

	_, err := l.conn.OpenSession(ctx, host.MethodNew, "s1", bindMeta(t, tu, lease))
	wantCode(t, err, "not_admitted")
	if state(t, l, "s1") != host.Pending {
		t.Fatalf("state after failed admission = %v", state(t, l, "s1"))
	}
	readRefused(t, l, "s1", "not_admitted")
	wantCode(t, l.conn.AllowHostTool(ctx, "s1", "bash", host.HostProcess), "denied")
	// A load without the meta cannot quietly unbind it.
	_, err = l.conn.OpenSession(ctx, host.MethodLoad, "s1", nil)
	wantCode(t, err, "not_admitted")
	readRefused(t, l, "s1", "not_admitted")

	client.Attach = admit
	if _, err := l.conn.OpenSession(ctx, host.MethodLoad, "s1", bindMeta(t, tu, lease)); err != nil {
		t.Fatalf("bind after admission: %v", err)
	}
	readOK(t, l, "s1")
}

// Rule 3: the tuple is immutable; only a same-tuple lease extension is
// accepted.
func TestRule3TupleIsImmutable(t *testing.T) {
	p := loadPlugin(t)
	lease := time.Now().Add(time.Hour)
	l := newLink(t, p, newClient(t, lease.Add(time.Hour)), "alice")
	ctx, tu := ctxT(t), tuple("alice", l.client.Root)
	if _, err := l.conn.OpenSession(ctx, host.MethodNew, "s1", bindMeta(t, tu, lease)); err != nil {
		t.Fatal(err)
	}
	// Same tuple, earlier lease: refused, binding untouched.
	_, err := l.conn.OpenSession(ctx, host.MethodLoad, "s1", bindMeta(t, tu, lease.Add(-time.Minute)))
	wantCode(t, err, "invalid")
	readOK(t, l, "s1")
	// Same tuple, later lease: accepted and extended.
	st, err := l.conn.OpenSession(ctx, host.MethodLoad, "s1", bindMeta(t, tu, lease.Add(30*time.Minute)))
	if err != nil || !st.LeaseNotAfter.Equal(lease.Add(30*time.Minute)) {
		t.Fatalf("extension: %v %v", st, err)
	}
	// Any changed field: refused, and the binding fences.
	for _, change := range []func(*admission.Tuple){
		func(x *admission.Tuple) { x.Generation++ },
		func(x *admission.Tuple) { x.Sandbox = "other" },
		func(x *admission.Tuple) { x.Root = x.Root + "/sub" },
	} {
		other := tu
		change(&other)
		_, err := l.conn.OpenSession(ctx, host.MethodLoad, "s1", bindMeta(t, other, lease.Add(time.Hour)))
		wantCode(t, err, "tuple_mismatch")
		readRefused(t, l, "s1", "fenced")
	}
}

// Rule 4: a new ACP connection reattaches explicitly (session/load with the
// same tuple, then `_tether/attach`) before any tool runs.
func TestRule4NewConnectionMustReattach(t *testing.T) {
	p := loadPlugin(t)
	lease := time.Now().Add(time.Hour)
	a := newLink(t, p, newClient(t, lease), "alice")
	ctx, tu := ctxT(t), tuple("alice", a.client.Root)
	if _, err := a.conn.OpenSession(ctx, host.MethodNew, "s1", bindMeta(t, tu, lease)); err != nil {
		t.Fatal(err)
	}
	b := newLink(t, p, a.client, "alice")
	readRefused(t, b, "s1", "fenced")
	_, err := b.conn.OpenSession(ctx, host.MethodLoad, "s1", nil)
	wantCode(t, err, "not_admitted")
	readRefused(t, b, "s1", "fenced")
	attaches := len(callsOf(a.client, acpmeta.MethodAttach))
	if _, err := b.conn.OpenSession(ctx, host.MethodLoad, "s1", bindMeta(t, tu, lease)); err != nil {
		t.Fatalf("reattach: %v", err)
	}
	if len(callsOf(a.client, acpmeta.MethodAttach)) != attaches+1 {
		t.Fatal("reattach did not call _tether/attach")
	}
	readOK(t, b, "s1")
	readRefused(t, a, "s1", "fenced") // the old connection lost it
}

// Rule 5: foreign principals and session operators cannot bind or reattach
// another owner's tuple, and their attempts change nothing.
func TestRule5ForeignAndOperatorRefused(t *testing.T) {
	p := loadPlugin(t)
	lease := time.Now().Add(time.Hour)
	a := newLink(t, p, newClient(t, lease), "alice")
	ctx, tu := ctxT(t), tuple("alice", a.client.Root)
	if _, err := a.conn.OpenSession(ctx, host.MethodNew, "s1", bindMeta(t, tu, lease)); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"bob", "operator", "alice-operator"} {
		f := newLink(t, p, a.client, who)
		_, err := f.conn.OpenSession(ctx, host.MethodLoad, "s1", bindMeta(t, tu, lease))
		wantCode(t, err, "denied")
		_, err = f.conn.OpenSession(ctx, host.MethodLoad, "s1", nil)
		wantCode(t, err, "denied")
		_, err = f.conn.OpenSession(ctx, host.MethodNew, "fresh-"+who, bindMeta(t, tu, lease))
		wantCode(t, err, "denied")
		readRefused(t, f, "s1", "fenced")
		_, err = f.conn.Status(ctx, "s1")
		wantCode(t, err, "denied") // nor can they read its state
	}
	readOK(t, a, "s1") // alice's binding is untouched
}

// Rule 6: expiry, a mismatch from the client and transport loss fence the
// binding; the fence is sticky until an explicit reattach.
func TestRule6FencesAreSticky(t *testing.T) {
	t.Run("expiry", func(t *testing.T) {
		// The lease ends when the test moves the plugin's clock past it,
		// never while the sessions are still being bound and read.
		clock := filepath.Join(t.TempDir(), "clock")
		setClock(t, clock, 0)
		p := loadPlugin(t, "clock="+clock)
		lease := time.Now().Add(time.Hour)
		client := newClient(t, time.Now().Add(time.Hour))
		client.Attach = grantUntil(lease, 3)
		l := newLink(t, p, client, "alice")
		ctx, tu := ctxT(t), tuple("alice", client.Root)
		for _, sid := range []string{"s1", "s2"} {
			x := tu
			x.Session = "tether-" + sid
			if _, err := l.conn.OpenSession(ctx, host.MethodNew, sid, bindMeta(t, x, time.Now().Add(time.Hour))); err != nil {
				t.Fatal(err)
			}
			readOK(t, l, sid)
		}
		setClock(t, clock, time.Until(lease)+time.Second)
		// Status alone, before any tool call, sees the lease has passed
		// and fences (never BOUND past the lease).
		st, err := l.conn.Status(ctx, "s2")
		if err != nil || st.State != host.Fenced || st.Code != "lease_expired" {
			t.Fatalf("status after the lease: %v %v", st, err)
		}
		readRefused(t, l, "s2", "fenced")
		readRefused(t, l, "s1", "lease_expired")
		readRefused(t, l, "s1", "fenced")
		setClock(t, clock, 0)
		readRefused(t, l, "s1", "fenced") // the fence is sticky, whatever the clock says now
		client.Attach = grantUntil(time.Now().Add(2*time.Hour), 4)
		if _, err := l.conn.OpenSession(ctx, host.MethodLoad, "s1", bindMeta(t, tu, time.Now().Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
		readOK(t, l, "s1")
	})
	t.Run("mismatch", func(t *testing.T) {
		l, digest := bound(t, loadPlugin(t))
		l.client.Bind("s1", "0000000000000000000000000000000000000000000000000000000000000000")
		readOK2 := func() error {
			_, err := l.conn.ReadTextFile(ctxT(t), "s1", host.CallOptions{}, "probe.txt", 0, 0)
			return err
		}
		wantCode(t, readOK2(), "tuple_mismatch")
		l.client.Bind("s1", digest) // the client is fine again; the fence holds
		readRefused(t, l, "s1", "fenced")
		if state(t, l, "s1") != host.Fenced {
			t.Fatal("not fenced")
		}
	})
	t.Run("transport", func(t *testing.T) {
		p := loadPlugin(t)
		l, _ := bound(t, p)
		ctx, tu := ctxT(t), tuple("alice", l.client.Root)
		n := newLink(t, p, l.client, "alice")
		l.cut()
		deadline := time.Now().Add(10 * time.Second)
		for state(t, n, "s1") != host.Fenced && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if state(t, n, "s1") != host.Fenced {
			t.Fatal("transport loss did not fence")
		}
		readRefused(t, n, "s1", "fenced")
		if _, err := n.conn.OpenSession(ctx, host.MethodLoad, "s1", bindMeta(t, tu, time.Now().Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
		readOK(t, n, "s1")
	})
}

// Rule 7: in a bound scope the host's own filesystem and process tools are
// refused; other sessions keep their own backends.
func TestRule7HostToolsRefusedInBoundScope(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	ctx := ctxT(t)
	if _, err := l.conn.OpenSession(ctx, host.MethodNew, "other", nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []host.HostToolKind{host.HostFilesystem, host.HostProcess} {
		wantCode(t, l.conn.AllowHostTool(ctx, "s1", "host-tool", k), "denied")
		if err := l.conn.AllowHostTool(ctx, "other", "host-tool", k); err != nil {
			t.Fatalf("unbound session lost its backend: %v", err)
		}
	}
	if err := l.conn.AllowHostTool(ctx, "s1", "calculator", host.HostOther); err != nil {
		t.Fatalf("non-fs tool refused: %v", err)
	}
	wantCode(t, l.conn.AllowHostTool(ctx, "never-reported", "bash", host.HostProcess), "not_admitted")
	wantCode(t, l.conn.AllowHostTool(ctx, "other", "bash", host.HostToolKind(0)), "invalid")
	// A dead plugin cannot say yes.
	_ = p.Close()
	if err := l.conn.AllowHostTool(ctx, "other", "bash", host.HostProcess); err == nil {
		t.Fatal("policy allowed a host tool with the plugin gone")
	}
}

// TestGlobFailsWhenBindingLostMidway: glob checks the binding after its
// commands; a binding lost in between is a failure, not partial success.
func TestGlobFailsWhenBindingLostMidway(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	ctx, tu := ctxT(t), tuple("alice", l.client.Root)
	if err := os.WriteFile(filepath.Join(l.client.Root, "a.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	l.client.OnTerminal = func(string) {
		other := tu
		other.Generation = 99
		_, err := l.conn.OpenSession(context.WithoutCancel(ctx), host.MethodLoad, "s1", bindMeta(t, other, time.Now().Add(time.Hour)))
		if code, _ := acperr.CodeOf(err); code != errcode.CodeTupleMismatch {
			t.Errorf("substitution: %v", errors.Join(err))
		}
	}
	_, err := l.conn.Glob(ctx, "s1", host.CallOptions{}, "*.txt", "")
	wantCode(t, err, "fenced")
	l.client.OnTerminal = nil
	// Once fenced, grep is refused by its check before (its check after
	// has a test of its own: TestGrepFailsWhenBindingLostMidway).
	creates := len(callsOf(l.client, "terminal/create"))
	_, err = l.conn.Grep(ctx, "s1", host.CallOptions{}, "x", "", host.GrepOptions{})
	wantCode(t, err, "fenced")
	if n := len(callsOf(l.client, "terminal/create")) - creates; n != 0 {
		t.Fatalf("grep in a fenced session sent %d terminal/create", n)
	}
}

// TestGrepFailsWhenBindingLostMidway: grep checks the binding after its
// command; a tuple substituted while the command runs turns its matches
// into a failure, never a partial success. The session is bound when grep
// starts, so only the check after can catch it.
func TestGrepFailsWhenBindingLostMidway(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	ctx, tu := ctxT(t), tuple("alice", l.client.Root)
	if err := os.WriteFile(filepath.Join(l.client.Root, "a.txt"), []byte("needle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Control: with the binding intact the same grep finds the line.
	r, err := l.conn.Grep(ctx, "s1", host.CallOptions{}, "needle", "", host.GrepOptions{})
	if err != nil || len(r.Matches) != 1 {
		t.Fatalf("grep in a bound session: %v %v", r, err)
	}
	var swapped atomic.Bool
	l.client.OnTerminal = func(m string) {
		if m != "terminal/create" || swapped.Swap(true) {
			return
		}
		other := tu
		other.Generation = 99
		_, err := l.conn.OpenSession(context.WithoutCancel(ctx), host.MethodLoad, "s1", bindMeta(t, other, time.Now().Add(time.Hour)))
		if code, _ := acperr.CodeOf(err); code != errcode.CodeTupleMismatch {
			t.Errorf("substitution: %v", errors.Join(err))
		}
	}
	creates := len(callsOf(l.client, "terminal/create"))
	r, err = l.conn.Grep(ctx, "s1", host.CallOptions{}, "needle", "", host.GrepOptions{})
	wantCode(t, err, "fenced")
	if r.Matches != nil {
		t.Fatalf("grep returned matches with its binding lost: %v", r)
	}
	if !swapped.Load() || len(callsOf(l.client, "terminal/create")) != creates+1 {
		t.Fatal("grep's command did not run: the check before refused it, not the check after")
	}
	if state(t, l, "s1") != host.Fenced {
		t.Fatalf("state after the substitution = %v", state(t, l, "s1"))
	}
}
