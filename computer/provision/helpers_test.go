package provision

// Helpers of this package's tests, shared with fixtures/computer's (which
// keeps its own copies: a test package cannot export to another).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// base returns a directory a computer can live in: traversable by the
// grant's uid all the way down.
func base(t testing.TB) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for p := d; p != "/"; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 && strings.HasPrefix(p, os.TempDir()) {
			if err := os.Chmod(p, fi.Mode().Perm()|0o011); err != nil {
				t.Fatal(err)
			}
		}
	}
	return d
}

func receiverBins(t testing.TB) bins.Set {
	t.Helper()
	testenv.Require(t, "root")
	s, err := bins.Build(ctxT(t, 5*time.Minute), bins.Receiver)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newLocal allocates a computer and registers a Close that must leave
// nothing behind.
func newLocal(t *testing.T, o Options) *Local {
	t.Helper()
	if o.Dir == "" {
		o.Dir = filepath.Join(base(t), "computer")
	}
	c, err := New(ctxT(t, 2*time.Minute), o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func wantCode(t *testing.T, err error, code errcode.Code) {
	t.Helper()
	var we *errcode.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Fatalf("got %v, want code %s", err, code)
	}
}

// isolated is a namespaced computer for an attack; the test's
// requirements are those of the namespaces and the limits.
func isolated(t *testing.T, o Options) *Local {
	t.Helper()
	testenv.Require(t, "root", "cgroup2", "cgroup-limits", "loop")
	o.Bins = receiverBins(t)
	c := newLocal(t, o)
	if s := c.State(); s.Isolation != IsolationNamespaces {
		t.Fatalf("isolation %q, want %q", s.Isolation, IsolationNamespaces)
	}
	return c
}

// ran is a finished command: its output and how it ended.
type ran struct {
	out  string
	exit wire.ExitStatus
}

func (r ran) String() string {
	code := "none"
	if r.exit.ExitCode != nil {
		code = strconv.Itoa(*r.exit.ExitCode)
	}
	return fmt.Sprintf("exit code %s signal %q, output:\n%s", code, r.exit.Signal, r.out)
}

// killedBy reports whether the command was killed by the named signal.
func (r ran) killedBy(sig string) bool { return r.exit.Signal == sig }

// runIn runs a shell script in the computer as the custodian would and
// waits (at most a minute) until it exits.
func runIn(t *testing.T, c *Local, script string) ran {
	t.Helper()
	id, wc := startIn(t, c, script)
	defer wc.Close()
	ctx := ctxT(t, time.Minute)
	var w wire.ExecWaitResult
	if err := wc.Call(ctx, wire.OpExecWait, c.Tuple().SHA256(), opKey(), time.Now().Add(time.Minute),
		wire.TerminalArgs{TerminalID: id}, &w); err != nil {
		t.Fatalf("exec_wait: %v", err)
	}
	r := ran{out: outputOf(t, c, wc, id), exit: w.Exit}
	var e wire.Empty
	_ = wc.Call(ctx, wire.OpExecRelease, c.Tuple().SHA256(), opKey(), time.Now().Add(time.Minute), wire.TerminalArgs{TerminalID: id}, &e)
	return r
}

// startIn starts a shell script in the computer and returns its terminal
// and the client (the caller closes it).
func startIn(t *testing.T, c *Local, script string) (string, wireCaller) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	wc, err := WireClient(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	var res wire.ExecStartResult
	if err := wc.Call(ctx, wire.OpExecStart, c.Tuple().SHA256(), opKey(), time.Now().Add(5*time.Minute),
		wire.ExecStartArgs{Argv: []string{"/bin/bash", "-c", script}, Env: map[string]string{"PATH": "/usr/bin:/bin"}}, &res); err != nil {
		wc.Close()
		t.Fatalf("exec_start: %v", err)
	}
	return res.TerminalID, wc
}

// wireCaller is the part of *wireclient.Client the attacks use.
type wireCaller interface {
	Call(ctx context.Context, op wire.Op, tuple, key string, deadline time.Time, args, result any) error
	Close() error
}

func outputOf(t *testing.T, c *Local, wc wireCaller, id string) string {
	t.Helper()
	var o wire.ExecOutputResult
	if err := wc.Call(ctxT(t, time.Minute), wire.OpExecOutput, c.Tuple().SHA256(), opKey(), time.Now().Add(time.Minute),
		wire.TerminalArgs{TerminalID: id}, &o); err != nil {
		t.Fatalf("exec_output: %v", err)
	}
	return o.Output
}

// awaitOutput polls the command's output until it contains want (at
// most 30 s).
func awaitOutput(t *testing.T, c *Local, wc wireCaller, id, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := outputOf(t, c, wc, id)
		if strings.Contains(out, want) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command never printed %q; output:\n%s", want, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func opKey() string { return "attack-" + randHex(8) }

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// nsHolders lists the processes in the namespace ns (a /proc/PID/ns link
// target) of kind that started before the clock tick before (nowTicks,
// read while the namespace was still the computer's). Once a namespace is
// freed, the next one made anywhere on the host gets its inode number (a
// jail or another computer of a test running in parallel): a process
// started after that moment and showing the number is in that new
// namespace (the flake hunt saw one such false leftover).
func nsHolders(t *testing.T, kind, ns string, before uint64) []int {
	t.Helper()
	all, err := AllProcesses()
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, p := range all {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", p.HostPID, kind))
		if err != nil || l != ns {
			continue
		}
		if start, err := StartTicks(p.HostPID); err == nil && start < before {
			out = append(out, p.HostPID)
		}
	}
	return out
}

// nowTicks is the time since boot in the clock ticks of /proc/PID/stat's
// start time (USER_HZ, 100 a second; both count boot time).
func nowTicks(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	secs, frac, ok := strings.Cut(strings.Fields(string(b))[0], ".")
	s, err1 := strconv.ParseUint(secs, 10, 64)
	c, err2 := strconv.ParseUint((frac + "00")[:2], 10, 64)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("/proc/uptime %q", b)
	}
	return s*100 + c
}

// waitUntil polls cond for at most 10 s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// landlockModes runs an attack with Landlock required and off: the
// namespaces alone must stop it.
var landlockModes = []string{LandlockRequired, LandlockOff}
