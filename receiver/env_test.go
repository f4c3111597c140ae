package receiver

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
)

// TestExecDefaultEnvironment: what ACP agents send (a bare name or a shell
// line, no PATH, no cwd) runs with the default environment; a grant's env
// is merged over the receiver's and a request's over both; HOME defaults to
// the grant root. A broken merge (the request's env alone, as before) makes
// the bare "sh" not_found and drops LANG and HOME.
func TestExecDefaultEnvironment(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	custom := f.newGrant("custom-env", allOps...)
	custom.Env = []admission.EnvVar{{Name: "HOME", Value: "/var/empty"}, {Name: "TOOL", Value: "grant"}, {Name: "LANG", Value: "C"}}
	f.publish(f.grant, custom)
	envOf := func(g admission.Grant, env map[string]string) string {
		t.Helper()
		id := f.start(g, wire.ExecStartArgs{Argv: []string{"sh", "-c", "env | sort | grep -v '^PWD='"}, Env: env})
		if w := f.wait(g, id); exitCode(w.Exit) != 0 {
			t.Fatalf("exit %+v", w.Exit)
		}
		return f.output(g, id).Output
	}
	want := "HOME=" + f.grant.Tuple.Root + "\nLANG=C.UTF-8\nPATH=" + DefaultChildEnv["PATH"] + "\n"
	if got := envOf(f.grant, nil); got != want {
		t.Fatalf("no env in the request: child env\n%s\nwant\n%s", got, want)
	}
	want = "HOME=/var/empty\nLANG=C\nPATH=" + DefaultChildEnv["PATH"] + "\nTOOL=request\n"
	if got := envOf(custom, map[string]string{"TOOL": "request"}); got != want {
		t.Fatalf("grant env under the request's: child env\n%s\nwant\n%s", got, want)
	}
	custom.Env = []admission.EnvVar{{Name: "LD_PRELOAD", Value: "/tmp/x.so"}}
	f.publish(f.grant, custom)
	if _, err := f.call(custom, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}}); code(err) != errcode.CodeDenied {
		t.Fatalf("a grant's loader variable: %v, want denied", err)
	}
}

// TestExecChildEnvConfigured: the receiver's child_env replaces the
// default; an empty one leaves a bare name nothing to resolve in (the
// request must then send PATH), and HOME still defaults to the root.
func TestExecChildEnvConfigured(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{ChildEnv: map[string]string{}})
	_, err := f.call(f.grant, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"sh", "-c", "true"}})
	if code(err) != errcode.CodeNotFound || !strings.Contains(err.Error(), `PATH ""`) {
		t.Fatalf("bare name with no PATH anywhere: %v, want not_found naming the empty PATH", err)
	}
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", "echo $HOME $LANG."}})
	f.wait(f.grant, id)
	if got := f.output(f.grant, id).Output; got != f.grant.Tuple.Root+" .\n" {
		t.Fatalf("output %q", got)
	}
	if _, err := NewHandler(Options{Grants: f.h.grants, ChildEnv: map[string]string{"LD_AUDIT": "x"}}); err == nil {
		t.Fatal("a loader variable in child_env was accepted")
	}
}

// TestOutputLimitZeroKeepsNothing: outputByteLimit 0 keeps no output and
// says it truncated; an absent limit keeps up to the grant's bound.
func TestOutputLimitZeroKeepsNothing(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	for _, c := range []struct {
		limit     *int64
		out       string
		truncated bool
	}{{new(int64(0)), "", true}, {nil, "hello\n", false}, {new(int64(3)), "lo\n", true}} {
		id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/echo", "hello"}, OutputLimit: c.limit})
		f.wait(f.grant, id)
		if out := f.output(f.grant, id); out.Output != c.out || out.Truncated != c.truncated {
			t.Errorf("limit %v: output %q truncated %v, want %q %v", c.limit, out.Output, out.Truncated, c.out, c.truncated)
		}
	}
}

// TestOutputPolledWhileRunning: exec_output on a running command returns
// the output so far and no exit status; a character whose last byte has
// not arrived is held back until it has. The command blocks on a FIFO the
// test opens only after it has seen the partial character in the buffer,
// so no poll races the command.
func TestOutputPolledWhileRunning(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	gate := filepath.Join(f.grant.Tuple.Root, "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(gate, int(gUID), int(gGID)); err != nil {
		t.Fatal(err)
	}
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"sh", "-c", `printf 'first\342\202\254\342\202'; read x < gate; printf '\254 done'`}})
	tm := f.h.terms.get(f.grant.Tuple.SHA256(), id)
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for raw, _ := tm.out.Snapshot(true); raw != "first€\xe2\x82"; raw, _ = tm.out.Snapshot(true) {
		if time.Now().After(deadline) {
			t.Fatalf("the command's first output never arrived (have %q)", raw)
		}
		time.Sleep(2 * time.Millisecond)
	}
	out := f.output(f.grant, id)
	if out.Output != "first€" || out.Truncated || out.Exit != nil {
		t.Fatalf("polled while running: %+v, want the output so far up to the last whole character and no exit", out)
	}
	w, err := os.OpenFile(gate, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("go\n")
	w.Close()
	f.wait(f.grant, id)
	out = f.output(f.grant, id)
	if out.Output != "first€€ done" || out.Exit == nil || exitCode(*out.Exit) != 0 {
		t.Fatalf("after exit: %+v", out)
	}
}

// TestTailBufferSnapshot checks the hold-back of an incomplete trailing
// character while running and the final snapshot's every byte.
func TestTailBufferSnapshot(t *testing.T) {
	for _, c := range []struct{ in, running string }{
		{"ab", "ab"}, {"a\xe2\x82", "a"}, {"a\xe2", "a"}, {"a\xf0\x9f\x98", "a"}, {"a\xf0\x9f\x98\x80", "a😀"},
		{"a\x82\x82\x82\x82", "a\x82\x82\x82\x82"}, {"€", "€"}, {"", ""},
	} {
		b := newTailBuffer(64)
		b.Write([]byte(c.in))
		if got, _ := b.Snapshot(false); got != c.running {
			t.Errorf("running snapshot of %q = %q, want %q", c.in, got, c.running)
		}
		if got, _ := b.Snapshot(true); got != c.in {
			t.Errorf("final snapshot of %q = %q", c.in, got)
		}
	}
	b := newTailBuffer(4)
	b.Write([]byte("xx€€"))
	if got, trunc := b.Snapshot(false); got != "€" || !trunc || !utf8.ValidString(got) {
		t.Errorf("truncated to 4 bytes: %q %v, want the last whole character", got, trunc)
	}
}
