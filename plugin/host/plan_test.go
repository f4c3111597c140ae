package host

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/acptest"
	"github.com/tetherdev/tether/plugin/contract"
	"github.com/tetherdev/tether/plugin/toolplan"
)

// These tests drive the host library against a plugin that stands in for
// tether-plugin (it returns the plans a test gives it and records reports;
// anything else it is asked fails the test) and a real ACP connection to
// the test client, which runs real processes.

const testDigest = "ab0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd"

var errUnexpected = errors.New("unexpected call to the stand-in plugin")

type standIn struct {
	t    *testing.T
	plan func(contract.ToolCall) (contract.Plan, error)

	mu      sync.Mutex
	reports []contract.Report
}

var _ contract.Plugin = &standIn{}

func (s *standIn) Connect(context.Context, string) (string, error) { return "conn-test", nil }
func (s *standIn) Disconnect(context.Context, string) error        { return nil }
func (s *standIn) OpenSession(context.Context, contract.OpenRequest, contract.Attacher) (contract.Status, error) {
	s.t.Error("OpenSession: " + errUnexpected.Error())
	return contract.Status{}, errUnexpected
}
func (s *standIn) Status(context.Context, string, string) (contract.Status, error) {
	s.t.Error("Status: " + errUnexpected.Error())
	return contract.Status{}, errUnexpected
}
func (s *standIn) ToolPolicy(context.Context, string, string, string, contract.HostToolKind) error {
	s.t.Error("ToolPolicy: " + errUnexpected.Error())
	return errUnexpected
}
func (s *standIn) Authorize(_ context.Context, c contract.ToolCall) (contract.Plan, error) {
	return s.plan(c)
}
func (s *standIn) Report(_ context.Context, r contract.Report) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports = append(s.reports, r)
	return nil
}

func (s *standIn) reported() []contract.Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]contract.Report(nil), s.reports...)
}

// idle is the agent side of the rig; the client never calls it.
type idle struct{ acp.Agent }

type rig struct {
	conn   *Conn
	client *acptest.Client
	plugin *standIn
	call   toolplan.Call // builds plans as tether-plugin does
	cut    func()
}

func newRig(t *testing.T) *rig {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	client := &acptest.Client{Root: root}
	client.Bind("s1", testDigest)
	client.Bind("s2", testDigest)
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	asc := acp.NewAgentSideConnection(idle{}, a2cW, c2aR)
	csc := acp.NewClientSideConnection(client, c2aW, a2cR)
	quiet := slog.New(slog.DiscardHandler)
	asc.SetLogger(quiet)
	csc.SetLogger(quiet)
	cut := func() { c2aW.Close(); a2cW.Close(); c2aR.Close(); a2cR.Close() }
	p := &standIn{t: t}
	conn, err := connect(context.Background(), p, asc, "alice")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cut(); _ = conn.Close() })
	call := toolplan.Call{SessionID: "s1", Root: root, TupleSHA256: testDigest, OpKey: "op-test", Deadline: time.Now().Add(time.Minute)}
	return &rig{conn: conn, client: client, plugin: p, call: call, cut: cut}
}

var fenceCodes = []errcode.Code{errcode.CodeFateUnknown, errcode.CodeFenced, errcode.CodeLeaseExpired,
	errcode.CodeNotAdmitted, errcode.CodeTupleMismatch, errcode.CodeUnavailable}

// plan wraps a step as the plugin would.
func (r *rig) plan(st contract.Step) contract.Plan {
	return contract.Plan{Ticket: "ticket", SessionID: r.call.SessionID, OpKey: r.call.OpKey, Deadline: r.call.Deadline,
		FenceCodes: fenceCodes, Step: st}
}

// must is for plans the test builds, which are valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestBadPlanSendsNothing attacks the host library with plans that do not
// fit the call they answer: another session, another tool's requests, a
// request without its op tag or with a `_meta` key outside the contract,
// a clean-up past the bound. Each is refused (ErrBadPlan) and nothing
// reaches the client; the same call with a fitting plan is sent.
func TestBadPlanSendsNothing(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	read := must(r.call.Read("f.txt", 0, 0))
	pwn := must(r.call.Run(contract.RunTool{Command: "/bin/sh", Args: []string{"-c", "touch pwned"}}))
	withKey := func(m contract.Meta, k string) contract.Meta {
		out := contract.Meta{k: []byte(`{"x":1}`)}
		for key, v := range m {
			out[key] = v
		}
		return out
	}
	list := must(r.call.List("."))
	glob := must(r.call.Glob("*", "."))
	edit := must(r.call.Edit("f.txt", "a", "b"))
	for name, c := range map[string]struct {
		tool contract.Tool
		plan contract.Plan
	}{
		"another_session": {contract.ReadTool{Path: "f.txt"}, func() contract.Plan { p := r.plan(read); p.SessionID = "s2"; return p }()},
		"another_tool":    {contract.ReadTool{Path: "f.txt"}, r.plan(pwn)},
		"foreign_meta":    {contract.ReadTool{Path: "f.txt"}, r.plan(contract.ReadStep{Path: read.Path, Meta: withKey(read.Meta, acpmeta.KeyBind)})},
		"no_op_tag":       {contract.ReadTool{Path: "f.txt"}, r.plan(contract.ReadStep{Path: read.Path, Meta: contract.Meta{}})},
		"no_ticket":       {contract.ReadTool{Path: "f.txt"}, func() contract.Plan { p := r.plan(read); p.Ticket = ""; return p }()},
		"verify_on_list": {contract.ListTool{}, r.plan(func() contract.TerminalStep {
			list.CreateMeta = withKey(list.CreateMeta, acpmeta.KeyVerify)
			return list
		}())},
		"long_cleanup":     {contract.RunTool{Command: "/bin/true"}, r.plan(func() contract.TerminalStep { p := pwn; p.CleanupTimeout = 2 * time.Minute; return p }())},
		"glob_without_dir": {contract.GlobTool{Pattern: "*"}, r.plan(func() contract.TerminalStep { g := glob; g.Dir = ""; return g }())},
		"expect_from_plugin": {contract.EditTool{Path: "f.txt", OldText: "a", NewText: "b"}, r.plan(func() contract.EditStep {
			e := edit
			e.WriteMeta = withKey(e.WriteMeta, acpmeta.KeyExpect)
			return e
		}())},
	} {
		r.plugin.plan = func(contract.ToolCall) (contract.Plan, error) { return c.plan, nil }
		_, err := r.conn.authorize(ctx, "s1", CallOptions{}, c.tool)
		if !errors.Is(err, ErrBadPlan) {
			t.Errorf("%s: %v, want ErrBadPlan", name, err)
		}
	}
	// Through the exported calls too: nothing reached the client.
	r.plugin.plan = func(contract.ToolCall) (contract.Plan, error) { return r.plan(pwn), nil }
	if _, err := r.conn.ReadTextFile(ctx, "s1", CallOptions{}, "f.txt", 0, 0); !errors.Is(err, ErrBadPlan) {
		t.Fatalf("read answered with a run: %v", err)
	}
	if n := len(r.client.Calls()); n != 0 {
		t.Fatalf("the client saw %d requests from refused plans", n)
	}
	if _, err := os.Stat(filepath.Join(r.call.Root, "pwned")); err == nil {
		t.Fatal("a refused plan ran its command")
	}
	// Control: the fitting plan is sent.
	if err := os.WriteFile(filepath.Join(r.call.Root, "f.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.plugin.plan = func(contract.ToolCall) (contract.Plan, error) { return r.plan(read), nil }
	if res, err := r.conn.ReadTextFile(ctx, "s1", CallOptions{}, "f.txt", 0, 0); err != nil || res.Content != "x" {
		t.Fatalf("a fitting plan: %+v %v", res, err)
	}
}

// methods returns the methods the client saw, in order.
func methods(c *acptest.Client) string {
	var m []string
	for _, call := range c.Calls() {
		m = append(m, strings.TrimPrefix(call.Method, "terminal/"))
	}
	return strings.Join(m, ",")
}

// TestTerminalSequence: a terminal plan is sent as one fixed sequence:
// create, wait to the deadline or the caller's cancel, kill only if the
// wait was ended, output, release; a command that started is never left
// running or unreleased.
func TestTerminalSequence(t *testing.T) {
	ctx := context.Background()
	run := func(t *testing.T, r *rig, ctx context.Context, argv []string, deadline time.Duration) terminalRun {
		r.call.Deadline = time.Now().Add(deadline)
		st := must(r.call.Run(contract.RunTool{Command: argv[0], Args: argv[1:]}))
		x := &toolCall{c: r.conn, tool: "run_command", plan: r.plan(st)}
		return x.terminal(ctx, st)
	}
	t.Run("exits", func(t *testing.T) {
		r := newRig(t)
		got := run(t, r, ctx, []string{"/bin/sh", "-c", "echo hi; exit 3"}, time.Minute)
		if got.exit.ExitCode == nil || *got.exit.ExitCode != 3 || got.out != "hi\n" || got.timedOut || got.cancelled ||
			methods(r.client) != "create,wait_for_exit,output,release" {
			t.Fatalf("%+v; client saw %s", got, methods(r.client))
		}
	})
	t.Run("deadline", func(t *testing.T) {
		r := newRig(t)
		got := run(t, r, ctx, []string{"/bin/sleep", "30"}, 200*time.Millisecond)
		if !got.timedOut || got.cancelled || got.exit.Signal == nil || *got.exit.Signal != "killed" ||
			methods(r.client) != "create,wait_for_exit,kill,output,release" || r.client.Running() != 0 {
			t.Fatalf("%+v; client saw %s", got, methods(r.client))
		}
	})
	t.Run("stopped", func(t *testing.T) {
		r := newRig(t)
		stop, cancel := context.WithCancel(ctx)
		time.AfterFunc(200*time.Millisecond, cancel)
		got := run(t, r, stop, []string{"/bin/sleep", "30"}, time.Minute)
		if got.timedOut || !got.cancelled || methods(r.client) != "create,wait_for_exit,kill,output,release" || r.client.Running() != 0 {
			t.Fatalf("%+v; client saw %s", got, methods(r.client))
		}
	})
	t.Run("stopped_before", func(t *testing.T) {
		r := newRig(t)
		stop, cancel := context.WithCancel(ctx)
		cancel()
		got := run(t, r, stop, []string{"/bin/true"}, time.Minute)
		if !got.cancelled || got.create.sent || methods(r.client) != "" {
			t.Fatalf("%+v; client saw %s", got, methods(r.client))
		}
	})
	// The wait reaches the client after the plan's deadline (a loaded
	// machine; here its op tag's deadline has passed already, the host's
	// timer not yet): the client refuses it as late, and the run is timed
	// out exactly as if the host's timer had fired first.
	t.Run("wait_late", func(t *testing.T) {
		r := newRig(t)
		st := must(r.call.Run(contract.RunTool{Command: "/bin/sleep", Args: []string{"30"}}))
		late := r.call
		late.Deadline = time.Now().Add(-time.Millisecond)
		st.WaitMeta = must(late.Run(contract.RunTool{Command: "/bin/sleep", Args: []string{"30"}})).WaitMeta
		x := &toolCall{c: r.conn, tool: "run_command", plan: r.plan(st)}
		got := x.terminal(ctx, st)
		if !got.timedOut || got.cancelled || got.wait.err != nil || got.exit.Signal == nil || *got.exit.Signal != "killed" ||
			methods(r.client) != "create,wait_for_exit,kill,output,release" || r.client.Running() != 0 {
			t.Fatalf("%+v; client saw %s", got, methods(r.client))
		}
	})
	t.Run("wait_refused_fences", func(t *testing.T) {
		r := newRig(t)
		st := must(r.call.Run(contract.RunTool{Command: "/bin/sleep", Args: []string{"30"}}))
		other := r.call
		other.TupleSHA256 = strings.Repeat("0", 64)
		st.WaitMeta = must(other.Run(contract.RunTool{Command: "/bin/true"})).WaitMeta
		x := &toolCall{c: r.conn, tool: "run_command", plan: r.plan(st)}
		_, err := x.commandResult(ctx, x.terminal(ctx, st))
		if code, _ := acperr.CodeOf(err); code != errcode.CodeTupleMismatch || methods(r.client) != "create,wait_for_exit,release" ||
			r.client.Running() != 0 {
			t.Fatalf("%v; client saw %s", err, methods(r.client))
		}
		reps := r.plugin.reported()
		if len(reps) != 1 || len(reps[0].Failures) != 1 || reps[0].Failures[0].Request != "terminal/wait_for_exit" ||
			reps[0].Failures[0].Code != errcode.CodeTupleMismatch || reps[0].Ticket != "ticket" {
			t.Fatalf("reports: %+v", reps)
		}
	})
}

// TestOnlyFenceCodesAreReported: the plugin hears of a request's failure,
// before the call returns, exactly when it must decide on it: a fence code
// or the connection's loss; a plain refusal (not_found) costs no report.
func TestOnlyFenceCodesAreReported(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	read := must(r.call.Read("missing.txt", 0, 0))
	r.plugin.plan = func(contract.ToolCall) (contract.Plan, error) { return r.plan(read), nil }
	_, err := r.conn.ReadTextFile(ctx, "s1", CallOptions{}, "missing.txt", 0, 0)
	if code, _ := acperr.CodeOf(err); code != errcode.CodeNotFound || len(r.plugin.reported()) != 0 {
		t.Fatalf("not_found: %v, %d reports", err, len(r.plugin.reported()))
	}
	r.client.Bind("s1", strings.Repeat("0", 64))
	_, err = r.conn.ReadTextFile(ctx, "s1", CallOptions{}, "missing.txt", 0, 0)
	reps := r.plugin.reported()
	if code, _ := acperr.CodeOf(err); code != errcode.CodeTupleMismatch || len(reps) != 1 ||
		reps[0].Failures[0].Code != errcode.CodeTupleMismatch || !strings.Contains(reps[0].Failures[0].Message, "is not the binding's") {
		t.Fatalf("tuple_mismatch: %v, reports %+v", err, reps)
	}
	r.cut()
	<-r.conn.asc.Done()
	_, err = r.conn.ReadTextFile(ctx, "s1", CallOptions{}, "missing.txt", 0, 0)
	reps = r.plugin.reported()
	if code, _ := acperr.CodeOf(err); code != errcode.CodeFateUnknown || len(reps) != 2 || !reps[1].Failures[0].Transport {
		t.Fatalf("lost connection: %v, reports %+v", err, reps)
	}
}
