package host_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/acptest"
	"github.com/tetherdev/tether/plugin/host"
	"github.com/tetherdev/tether/plugin/toolplan"
)

// bound returns a link with session "s1" bound to a tuple rooted at the
// client's directory.
func bound(t *testing.T, p *host.Plugin) (*link, string) {
	t.Helper()
	lease := time.Now().Add(time.Hour)
	client := newClient(t, lease)
	l := newLink(t, p, client, "alice")
	tu := tuple("alice", client.Root)
	if _, err := l.conn.OpenSession(ctxT(t), host.MethodNew, "s1", bindMeta(t, tu, lease)); err != nil {
		t.Fatalf("bind: %v", err)
	}
	return l, tu.SHA256()
}

// checkOpTags asserts that every fs/terminal callback carried a valid op
// tag with the tuple's digest, and returns the distinct base keys.
func checkOpTags(t *testing.T, c *acptest.Client, digest string) map[string]bool {
	t.Helper()
	bases := map[string]bool{}
	for _, call := range c.Calls() {
		if !strings.HasPrefix(call.Method, "fs/") && !strings.HasPrefix(call.Method, "terminal/") {
			continue
		}
		if call.OpErr != nil || call.Op.TupleSHA256 != digest {
			t.Errorf("%s carried op tag %+v (err %v)", call.Method, call.Op, call.OpErr)
			continue
		}
		base, _, _ := strings.Cut(call.Op.OpKey, ":")
		bases[base] = true
	}
	return bases
}

func TestIntegrationFiveToolsAndGlobGrep(t *testing.T) {
	p := loadPlugin(t)
	l, digest := bound(t, p)
	ctx, root := ctxT(t), l.client.Root

	if _, err := l.conn.WriteTextFile(ctx, "s1", host.CallOptions{}, "src/main.go", "package main\n\nfunc main() {}\n"); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
	if err := os.MkdirAll(filepath.Join(root, "src", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := l.conn.WriteTextFile(ctx, "s1", host.CallOptions{}, "src/main.go", "package main\n\nfunc main() {}\n")
	if err != nil || w.Bytes != 29 {
		t.Fatalf("write: %v %v", w, err)
	}
	if _, err := l.conn.WriteTextFile(ctx, "s1", host.CallOptions{}, "src/sub/notes.txt", "one\ntwo\nthree\n"); err != nil {
		t.Fatal(err)
	}
	r, err := l.conn.ReadTextFile(ctx, "s1", host.CallOptions{}, "src/sub/notes.txt", 2, 1)
	if err != nil || r.Content != "two\n" {
		t.Fatalf("read line 2: %q %v", r.Content, err)
	}
	e, err := l.conn.EditTextFile(ctx, "s1", host.CallOptions{}, "src/main.go", "func main() {}", "func main() { println(1) }")
	if err != nil || e.PreviousSHA256 != toolplan.SHA256Hex("package main\n\nfunc main() {}\n") {
		t.Fatalf("edit: %v %v", e, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "src/main.go")); string(b) != "package main\n\nfunc main() { println(1) }\n" {
		t.Fatalf("after edit: %q", b)
	}
	ls, err := l.conn.ListDirectory(ctx, "s1", host.CallOptions{}, "src")
	if err != nil || len(ls.Entries) != 2 || ls.Entries[0].Name != "main.go" ||
		ls.Entries[0].Type != "file" || ls.Entries[1].Type != "dir" {
		t.Fatalf("list: %v %v", ls, err)
	}
	run, err := l.conn.RunCommand(ctx, "s1", host.CallOptions{}, host.Command{Command: "/bin/sh",
		Args: []string{"-c", "pwd; echo out; exit 3"}, Cwd: "src"})
	if err != nil || exitCode(run) != 3 || run.Output != filepath.Join(root, "src")+"\nout\n" {
		t.Fatalf("run: %v %v", run, err)
	}
	g, err := l.conn.Glob(ctx, "s1", host.CallOptions{}, "**/*.txt", "")
	if err != nil || len(g.Matches) != 1 || g.Matches[0] != filepath.Join(root, "src/sub/notes.txt") {
		t.Fatalf("glob: %v %v", g, err)
	}
	gr, err := l.conn.Grep(ctx, "s1", host.CallOptions{}, "TWO", "src", host.GrepOptions{IgnoreCase: true})
	if err != nil || len(gr.Matches) != 1 || gr.Matches[0].Line != 2 || gr.Matches[0].Text != "two" {
		t.Fatalf("grep: %v %v", gr, err)
	}
	if l.client.Running() != 0 {
		t.Fatalf("%d terminals left unreleased", l.client.Running())
	}
	// Every callback carried the tag; every tool call got its own fresh key.
	if bases := checkOpTags(t, l.client, digest); len(bases) != 9 {
		t.Fatalf("distinct op keys = %d, want one per tool call (9): %v", len(bases), bases)
	}
}

func TestOpKeyRetryReusesCallersKey(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	ctx := ctxT(t)
	for i := 0; i < 2; i++ {
		if _, err := l.conn.WriteTextFile(ctx, "s1", host.CallOptions{OpKey: "retry-7"}, "f.txt", "x"); err != nil {
			t.Fatal(err)
		}
	}
	writes := callsOf(l.client, "fs/write_text_file")
	if len(writes) != 2 || writes[0].Op.OpKey != "retry-7:write" || writes[1].Op.OpKey != "retry-7:write" {
		t.Fatalf("retry keys: %+v", writes)
	}
	_, err := l.conn.WriteTextFile(ctx, "s1", host.CallOptions{OpKey: "bad key!"}, "f.txt", "x")
	wantCode(t, err, "invalid")
}

func TestWriteEmptyContentRefusedBeforeSending(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	_, err := l.conn.WriteTextFile(ctxT(t), "s1", host.CallOptions{}, "empty.txt", "")
	wantCode(t, err, "invalid")
	if !strings.Contains(err.Error(), "WriteTextFileRequest.Validate") {
		t.Fatalf("refusal does not explain itself: %v", err)
	}
	if n := len(callsOf(l.client, "fs/write_text_file")); n != 0 {
		t.Fatalf("%d writes were sent", n)
	}
}

// TestEditLosesNoUpdate races a writer between edit's read and its write:
// the write carries the read content's hash, so it is refused and the
// other writer's content survives.
func TestEditLosesNoUpdate(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	f := filepath.Join(l.client.Root, "doc.txt")
	if err := os.WriteFile(f, []byte("alpha beta\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l.client.AfterRead = func(string) { _ = os.WriteFile(f, []byte("alpha beta gamma\n"), 0o644) }
	_, err := l.conn.EditTextFile(ctxT(t), "s1", host.CallOptions{}, "doc.txt", "beta", "BETA")
	wantCode(t, err, "precondition_failed")
	if b, _ := os.ReadFile(f); string(b) != "alpha beta gamma\n" {
		t.Fatalf("concurrent update lost: %q", b)
	}
	w := callsOf(l.client, "fs/write_text_file")
	if len(w) != 1 || w[0].Expect == nil || w[0].Expect.SHA256 != toolplan.SHA256Hex("alpha beta\n") {
		t.Fatalf("write did not carry the expected hash: %+v", w)
	}
	l.client.AfterRead = nil
	_, err = l.conn.EditTextFile(ctxT(t), "s1", host.CallOptions{}, "doc.txt", "a", "A")
	wantCode(t, err, "precondition_failed") // "a" occurs more than once
}

func TestRunCommandDeadlineKillsAndReleases(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	start := time.Now()
	run, err := l.conn.RunCommand(ctxT(t), "s1", host.CallOptions{Timeout: 300 * time.Millisecond},
		host.Command{Command: "/bin/sh", Args: []string{"-c", "echo started; exec sleep 30"}})
	if err != nil || !run.TimedOut || signal(run) != "killed" || run.Output != "started\n" {
		t.Fatalf("run past deadline: %v %v", run, err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("kill took %v", time.Since(start))
	}
	if len(callsOf(l.client, "terminal/kill")) != 1 || l.client.Running() != 0 {
		t.Fatal("terminal not killed and released")
	}
}

func TestRunCommandCancelKills(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	ctx, cancel := context.WithCancel(ctxT(t))
	l.client.OnTerminal = func(string) { time.AfterFunc(200*time.Millisecond, cancel) }
	_, err := l.conn.RunCommand(ctx, "s1", host.CallOptions{}, host.Command{Command: "/bin/sleep", Args: []string{"30"}})
	if err == nil {
		t.Fatal("cancelled command reported success")
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.client.Running() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(callsOf(l.client, "terminal/kill")) != 1 || l.client.Running() != 0 {
		t.Fatalf("cancel did not kill and release: kills=%d running=%d", len(callsOf(l.client, "terminal/kill")), l.client.Running())
	}
}

func TestPathEscapeRefusedBeforeSending(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	for _, bad := range []string{"../outside.txt", "/etc/passwd", "a/../../b"} {
		_, err := l.conn.ReadTextFile(ctxT(t), "s1", host.CallOptions{}, bad, 0, 0)
		wantCode(t, err, "path_escape")
	}
	if n := len(callsOf(l.client, "fs/read_text_file")); n != 0 {
		t.Fatalf("%d escaping reads were sent", n)
	}
}

// TestClientErrorCodeSurvivesTheHop: the client's JSON-RPC error (data
// {"tether": CODE}) reaches the host with its code.
func TestClientErrorCodeSurvivesTheHop(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	_, err := l.conn.ReadTextFile(ctxT(t), "s1", host.CallOptions{}, "missing.txt", 0, 0)
	wantCode(t, err, "not_found")
	if code, _ := acperr.CodeOf(err); code != "not_found" || !strings.Contains(err.Error(), "missing.txt does not exist") {
		t.Fatalf("message lost: %v", err)
	}
}

// TestRunCommandVerifySentAsTetherVerify: expected digests travel as
// `_meta["tether/verify"]` on terminal/create, paths relative to the tuple
// root and digests lowercase; malformed requests are refused before
// anything is sent.
func TestRunCommandVerifySentAsTetherVerify(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	ctx, root := ctxT(t), l.client.Root
	sum := toolplan.SHA256Hex("built\n")
	run, err := l.conn.RunCommand(ctx, "s1", host.CallOptions{}, host.Command{Command: "/bin/sh",
		Args: []string{"-c", "printf 'built\\n' > out.txt"}, Verify: map[string]string{
			"out.txt": strings.ToUpper(sum), filepath.Join(root, "sub/../other.txt"): sum}})
	if err != nil || exitCode(run) != 0 {
		t.Fatalf("run with verify: %v %v", run, err)
	}
	creates := callsOf(l.client, "terminal/create")
	if len(creates) != 1 || creates[0].Verify == nil {
		t.Fatalf("terminal/create carried no tether/verify: %+v", creates)
	}
	want := map[string]string{"out.txt": sum, "other.txt": sum}
	if got := creates[0].Verify.Files; len(got) != 2 || got["out.txt"] != want["out.txt"] || got["other.txt"] != want["other.txt"] {
		t.Fatalf("tether/verify files = %v, want %v", got, want)
	}
	many := map[string]string{}
	for i := 0; i <= acpmeta.MaxVerifyFiles; i++ {
		many[fmt.Sprintf("f%d", i)] = sum
	}
	for _, c := range []struct {
		verify map[string]string
		code   string
	}{
		{map[string]string{"../escape.txt": sum}, "path_escape"},
		{map[string]string{"/etc/passwd": sum}, "path_escape"},
		{map[string]string{"out.txt": "not-a-digest"}, "invalid"},
		{map[string]string{".": sum}, "invalid"},
		{map[string]string{"a.txt": sum, "./a.txt": sum}, "invalid"},
		{many, "invalid"},
	} {
		_, err := l.conn.RunCommand(ctx, "s1", host.CallOptions{}, host.Command{Command: "/bin/true", Verify: c.verify})
		wantCode(t, err, c.code)
	}
	if n := len(callsOf(l.client, "terminal/create")); n != 1 {
		t.Fatalf("%d creates sent; the malformed requests must send nothing", n)
	}
}

// TestRunCommandStepErrorFences: a binding error from any step of the
// host's terminal run (here terminal/output) fences the binding, as a
// call of its own would.
func TestRunCommandStepErrorFences(t *testing.T) {
	p := loadPlugin(t)
	l, digest := bound(t, p)
	l.client.OnTerminal = func(m string) {
		if m == "terminal/wait_for_exit" {
			l.client.Bind("s1", strings.Repeat("0", 64))
		}
	}
	_, err := l.conn.RunCommand(ctxT(t), "s1", host.CallOptions{}, host.Command{Command: "/bin/true"})
	wantCode(t, err, "tuple_mismatch")
	if !strings.Contains(err.Error(), "is not the binding's") || strings.Contains(err.Error(), `"code"`) {
		t.Fatalf("message: %v", err)
	}
	l.client.OnTerminal = nil
	l.client.Bind("s1", digest)
	readRefused(t, l, "s1", "fenced")
	// The fence names the client's own message, not its JSON-RPC error.
	st, err := l.conn.Status(ctxT(t), "s1")
	if err != nil || st.Code != "tuple_mismatch" || !strings.Contains(st.Message, "is not the binding's") ||
		strings.Contains(st.Message, `"code"`) {
		t.Fatalf("fenced status: %v %v", st, err)
	}
}

// TestAttachRefusalNamesCodeAndMessage: a refused `_tether/attach` comes
// back with the client's code and its own message, not the JSON-RPC error
// as text.
func TestAttachRefusalNamesCodeAndMessage(t *testing.T) {
	p := loadPlugin(t)
	lease := time.Now().Add(time.Hour)
	client := newClient(t, lease)
	client.Attach = func(context.Context, acpmeta.AttachRequest) (acpmeta.AttachResponse, error) {
		return acpmeta.AttachResponse{}, acperr.NewError(errcode.CodeLeaseExpired, "grant for tuple abc ended at 12:00")
	}
	l := newLink(t, p, client, "alice")
	_, err := l.conn.OpenSession(ctxT(t), host.MethodNew, "s1", bindMeta(t, tuple("alice", client.Root), lease))
	wantCode(t, err, "lease_expired")
	var we *errcode.Error
	if !errors.As(err, &we) || we.Message != `_tether/attach for session "s1" refused: grant for tuple abc ended at 12:00` {
		t.Fatalf("attach refusal message: %v", err)
	}
}
