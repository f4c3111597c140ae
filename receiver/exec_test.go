package receiver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/caps"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
)

// start runs exec_start and returns the terminal id.
func (f *fixture) start(g admission.Grant, a wire.ExecStartArgs) string {
	f.t.Helper()
	res, err := f.call(g, wire.OpExecStart, a)
	if err != nil {
		f.t.Fatalf("exec_start %v: %v", a.Argv, err)
	}
	return res.(*wire.ExecStartResult).TerminalID
}

func (f *fixture) wait(g admission.Grant, id string) *wire.ExecWaitResult {
	f.t.Helper()
	res, err := f.call(g, wire.OpExecWait, wire.TerminalArgs{TerminalID: id})
	if err != nil {
		f.t.Fatalf("exec_wait: %v", err)
	}
	return res.(*wire.ExecWaitResult)
}

func (f *fixture) output(g admission.Grant, id string) *wire.ExecOutputResult {
	f.t.Helper()
	res, err := f.call(g, wire.OpExecOutput, wire.TerminalArgs{TerminalID: id})
	if err != nil {
		f.t.Fatalf("exec_output: %v", err)
	}
	return res.(*wire.ExecOutputResult)
}

func exitCode(e wire.ExitStatus) int {
	if e.ExitCode == nil {
		return -1
	}
	return *e.ExitCode
}

func TestExecRoundTrip(t *testing.T) {
	testenv.Require(t, "root")
	for name, mode := range map[string]spawn.Mode{"thread": spawn.ModeThread, "helper": spawn.ModeHelper, "clone": spawn.ModeClone} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, Options{SpawnMode: mode})
			id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"sh", "-c", `echo "hi $A"; pwd; env | sort; printf new > made; exit 3`},
				Env: map[string]string{"PATH": "/usr/bin:/bin", "A": "b"}, HashAfterExit: []string{"made", "absent"}})
			w := f.wait(f.grant, id)
			if exitCode(w.Exit) != 3 || w.Exit.Signal != "" {
				t.Fatalf("exit = %+v", w.Exit)
			}
			sum := sha256.Sum256([]byte("new"))
			if w.FileSHA256["made"] != hex.EncodeToString(sum[:]) || w.FileSHA256["absent"] != "" {
				t.Fatalf("file digests = %v", w.FileSHA256)
			}
			out := f.output(f.grant, id)
			want := "hi b\n" + f.grant.Tuple.Root + "\nA=b\nHOME=" + f.grant.Tuple.Root + "\nLANG=C.UTF-8\nPATH=/usr/bin:/bin\nPWD=" + f.grant.Tuple.Root + "\n"
			if out.Output != want || out.Truncated || out.Exit == nil || exitCode(*out.Exit) != 3 {
				t.Fatalf("output = %+v\nwant %q", out, want)
			}
		})
	}
}

func TestExecRefusals(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	cases := []struct {
		name string
		args wire.ExecStartArgs
		want errcode.Code
	}{
		{"LD_PRELOAD", wire.ExecStartArgs{Argv: []string{"/bin/true"}, Env: map[string]string{"LD_PRELOAD": "/tmp/x.so"}}, errcode.CodeDenied},
		{"LD_LIBRARY_PATH", wire.ExecStartArgs{Argv: []string{"/bin/true"}, Env: map[string]string{"LD_LIBRARY_PATH": "/tmp"}}, errcode.CodeDenied},
		{"GLIBC_TUNABLES", wire.ExecStartArgs{Argv: []string{"/bin/true"}, Env: map[string]string{"GLIBC_TUNABLES": "x"}}, errcode.CodeDenied},
		{"relative argv0", wire.ExecStartArgs{Argv: []string{"./x"}}, errcode.CodeInvalid},
		{"PATH without the name", wire.ExecStartArgs{Argv: []string{"true"}, Env: map[string]string{"PATH": "/nonexistent"}}, errcode.CodeNotFound},
		{"relative path with a slash", wire.ExecStartArgs{Argv: []string{"bin/sh"}}, errcode.CodeInvalid},
		{"missing binary", wire.ExecStartArgs{Argv: []string{"/nonexistent/x"}}, errcode.CodeNotFound},
		{"cwd escape", wire.ExecStartArgs{Argv: []string{"/bin/true"}, Cwd: "../.."}, errcode.CodePathEscape},
		{"cwd missing", wire.ExecStartArgs{Argv: []string{"/bin/true"}, Cwd: "nope"}, errcode.CodeNotFound},
		{"empty argv", wire.ExecStartArgs{}, errcode.CodeInvalid},
	}
	for _, c := range cases {
		if _, err := f.call(f.grant, wire.OpExecStart, c.args); code(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("refused starts left %v", ps)
	}
}

// TestOutputTruncatedOnRuneBoundary prints far more than the limit in
// three-byte characters: the kept tail starts on a character boundary.
func TestOutputTruncatedOnRuneBoundary(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", `i=0; while [ $i -lt 3000 ]; do printf 'x€€€'; i=$((i+1)); done; printf END`},
		OutputLimit: new(int64(1000))})
	f.wait(f.grant, id)
	out := f.output(f.grant, id)
	if !out.Truncated || len(out.Output) > 1000 || len(out.Output) < 996 || !utf8.ValidString(out.Output) || !strings.HasSuffix(out.Output, "END") {
		t.Fatalf("truncated=%v len=%d valid=%v tail=%q", out.Truncated, len(out.Output), utf8.ValidString(out.Output), out.Output[max(0, len(out.Output)-8):])
	}
	id = f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", "head -c 100000 /dev/zero | tr '\\0' y"},
		OutputLimit: new(int64(1 << 30))})
	f.wait(f.grant, id)
	if out := f.output(f.grant, id); int64(len(out.Output)) != f.grant.Limits.MaxOutputBytes || !out.Truncated {
		t.Fatalf("output_limit above the grant: kept %d bytes, truncated %v; want the grant's %d", len(out.Output), out.Truncated, f.grant.Limits.MaxOutputBytes)
	}
}

// TestDeadlines: the command ends at the earliest of the request
// deadline, the grant's not_after and its max runtime. The deadlines leave
// a slow guest time to start the three commands before the first ends.
func TestDeadlines(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	short := f.newGrant("short-runtime", allOps...)
	short.Limits.MaxRuntimeS = 1
	ending := f.newGrant("ending", allOps...)
	ending.NotAfter = f.clk.Now().Add(3 * time.Second)
	f.publish(f.grant, short, ending)
	sleep := wire.ExecStartArgs{Argv: []string{"/bin/sleep", "100"}}

	res, err := f.callCtx(context.Background(), f.grant.Tuple.SHA256(), wire.OpExecStart, sleep, f.clk.Now().Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]admission.Grant{res.(*wire.ExecStartResult).TerminalID: f.grant}
	ids[f.start(short, sleep)] = short
	ids[f.start(ending, sleep)] = ending
	for id, g := range ids {
		start := time.Now()
		w := f.wait(g, id)
		if w.Exit.Signal != "KILL" || time.Since(start) > 20*time.Second {
			t.Errorf("%s: exit %+v after %v, want KILL at its deadline", g.Tuple.Allocation, w.Exit, time.Since(start))
		}
	}
}

func TestKillReleaseAndScope(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	other := f.newGrant("other", allOps...)
	f.publish(f.grant, other)
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", "sleep 100 & sleep 100"}})
	for _, op := range []wire.Op{wire.OpExecOutput, wire.OpExecWait, wire.OpExecKill, wire.OpExecRelease} {
		if _, err := f.call(other, op, wire.TerminalArgs{TerminalID: id}); code(err) != errcode.CodeNotFound {
			t.Fatalf("%s on another tuple's terminal: %v, want not_found", op, err)
		}
	}
	if _, err := f.call(f.grant, wire.OpExecKill, wire.TerminalArgs{TerminalID: id}); err != nil {
		t.Fatal(err)
	}
	if w := f.wait(f.grant, id); w.Exit.Signal != "KILL" {
		t.Fatalf("after exec_kill: %+v", w.Exit)
	}
	if out := f.output(f.grant, id); out.Exit == nil {
		t.Fatal("killed terminal lost its status")
	}
	id = f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", "sleep 100 & sleep 100"}})
	if _, err := f.call(f.grant, wire.OpExecRelease, wire.TerminalArgs{TerminalID: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.call(f.grant, wire.OpExecOutput, wire.TerminalArgs{TerminalID: id}); code(err) != errcode.CodeNotFound {
		t.Fatalf("released terminal still answers: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for len(procsOfUID(t, gUID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("release left %v running", ps)
	}
}

func TestExecLimitsAndReplay(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{Limits: Limits{MaxTerminals: 3}})
	one := f.newGrant("one-proc", allOps...)
	one.Limits.MaxProcs = 1
	f.publish(f.grant, one)
	sleep := wire.ExecStartArgs{Argv: []string{"/bin/sleep", "100"}}
	first := f.start(one, sleep)
	if _, err := f.call(one, wire.OpExecStart, sleep); code(err) != errcode.CodeDenied {
		t.Fatalf("second command under max_procs 1: %v", err)
	}
	f.call(one, wire.OpExecKill, wire.TerminalArgs{TerminalID: first})
	f.wait(one, first)
	f.wait(one, f.start(one, wire.ExecStartArgs{Argv: []string{"/bin/true"}})) // a finished command frees its proc
	f.start(f.grant, sleep)
	if _, err := f.call(f.grant, wire.OpExecStart, sleep); code(err) != errcode.CodeDenied {
		t.Fatalf("fourth terminal with max_terminals 3: %v", err)
	}
	// The same op_key never starts a second command.
	raw := []byte(`{"argv":["/bin/true"]}`)
	req := &wire.Request{ID: 1, Op: wire.OpExecStart, TupleSHA256: one.Tuple.SHA256(), OpKey: "same-key",
		Deadline: f.clk.Now().Add(time.Minute), Args: raw}
	if _, err := f.call(one, wire.OpExecRelease, wire.TerminalArgs{TerminalID: first}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.h.Serve(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if _, err := f.h.Serve(context.Background(), req); code(err) != errcode.CodeOpKeyConflict {
		t.Fatalf("replayed op_key: %v", err)
	}
}

func TestCloseKillsEverything(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	for range 3 {
		f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", "sleep 100 & sleep 100"}})
	}
	if n := len(procsOfUID(t, gUID)); n == 0 {
		t.Fatal("nothing started")
	}
	f.h.Close()
	// Close returns once every group got SIGKILL and every leader is reaped;
	// the other members exit and are reaped (the receiver is their
	// subreaper) asynchronously, so wait for that, bounded for a slow guest.
	// A Close that killed nothing leaves the 100 s sleepers and fails here.
	deadline := time.Now().Add(30 * time.Second)
	for len(procsOfUID(t, gUID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("processes %v survived Close", ps)
	}
	if _, err := f.call(f.grant, wire.OpStat, wire.StatArgs{Path: "."}); code(err) != errcode.CodeUnavailable {
		t.Fatalf("after Close: %v", err)
	}
}

// TestLandlockRequired: children of a handler with Landlock required
// cannot read what their uid could read outside the root.
func TestLandlockRequired(t *testing.T) {
	testenv.Require(t, "root")
	if spawn.LandlockABI() < spawn.MinLandlockABI {
		t.Fatalf("kernel Landlock ABI %d < %d", spawn.LandlockABI(), spawn.MinLandlockABI)
	}
	f := newFixture(t, Options{Landlock: LandlockConfig{Mode: LandlockRequired}})
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c",
		"echo in > mine && cat mine && cat /etc/hostname > /dev/null && echo sys; cat ../../admission/" + admission.FileName + " && echo LEAK"}})
	f.wait(f.grant, id)
	out := f.output(f.grant, id).Output
	if !strings.HasPrefix(out, "in\nsys\n") || strings.Contains(out, "LEAK") {
		t.Fatalf("confined child output %q", out)
	}
	if _, err := NewHandler(Options{Grants: lyingSource{}, Landlock: LandlockConfig{Mode: "best-effort"}}); err == nil {
		t.Fatal("an unknown landlock mode was accepted")
	}
}

// TestLandlockWritable: a directory in landlock.writable gets every right
// beneath (a child makes, writes and removes files and directories there,
// as mktemp does in a computer's /tmp); without it (the positive
// control) the same child is refused.
func TestLandlockWritable(t *testing.T) {
	testenv.Require(t, "root")
	if spawn.LandlockABI() < spawn.MinLandlockABI {
		t.Fatalf("kernel Landlock ABI %d < %d", spawn.LandlockABI(), spawn.MinLandlockABI)
	}
	tmp := t.TempDir()
	for _, d := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(d, 0o777|os.ModeSticky); err != nil {
			t.Fatal(err)
		}
	}
	script := fmt.Sprintf(`d=$(mktemp -d -p %s) && echo x > "$d/f" && mkdir "$d/sub" && rm -r "$d" && echo WROTE`, tmp)
	for _, c := range []struct {
		writable []string
		want     bool
	}{{[]string{tmp}, true}, {nil, false}} {
		f := newFixture(t, Options{Landlock: LandlockConfig{Mode: LandlockRequired, Writable: c.writable}})
		id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", script}})
		f.wait(f.grant, id)
		if out := f.output(f.grant, id).Output; strings.Contains(out, "WROTE") != c.want {
			t.Fatalf("writable %v: output %q, want WROTE %v", c.writable, out, c.want)
		}
	}
}

// TestNoLeakAfterSpawns: after 100 commands, every thread of this process
// still has its original privileges and no NoNewPrivs.
func TestNoLeakAfterSpawns(t *testing.T) {
	testenv.Require(t, "root")
	want, err := caps.ReadStatus("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, Options{Landlock: LandlockConfig{Mode: LandlockRequired}})
	for range 100 {
		id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/true"}})
		f.wait(f.grant, id)
		f.call(f.grant, wire.OpExecRelease, wire.TerminalArgs{TerminalID: id})
	}
	// A spawning thread exits right after its child is reaped, but its
	// exit is asynchronous: wait for the last ones (bounded for a slow guest).
	deadline := time.Now().Add(30 * time.Second)
	for {
		bad := taintedThreads(t, want)
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads still restricted after their children were reaped: %v", bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// taintedThreads lists the threads whose privileges differ from want or
// that have NoNewPrivs.
func taintedThreads(t *testing.T, want caps.Status) []string {
	sts, err := caps.ThreadStatuses(0)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for tid, st := range sts {
		if st.CapBnd != want.CapBnd || st.CapEff != want.CapEff || st.CapInh != 0 || st.CapAmb != 0 || st.NoNewPrivs != 0 {
			bad = append(bad, fmt.Sprintf("%d: Bnd %016x NNP %d", tid, st.CapBnd, st.NoNewPrivs))
		}
	}
	return bad
}

// TestRevocationKillsRunningCommands: a command whose grant disappears
// from the snapshot, or stops allowing exec, is killed within the recheck
// interval; a command of a grant that stays is not.
func TestRevocationKillsRunningCommands(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{RecheckEvery: 50 * time.Millisecond})
	gone := f.newGrant("gone", allOps...)
	narrowed := f.newGrant("narrowed", allOps...)
	f.publish(f.grant, gone, narrowed)
	sleep := wire.ExecStartArgs{Argv: []string{"/bin/sleep", "100"}}
	keep, g1, n1 := f.start(f.grant, sleep), f.start(gone, sleep), f.start(narrowed, sleep)
	narrowed.Ops = []admission.Op{admission.OpRead}
	f.publish(f.grant, narrowed)
	// The revoked tuples can no longer ask (their requests are refused),
	// so the terminals are read from the table.
	for id, g := range map[string]admission.Grant{g1: gone, n1: narrowed} {
		tm := f.h.terms.get(g.Tuple.SHA256(), id)
		select {
		case <-tm.done:
			if st := tm.status(); st.Signal != "KILL" {
				t.Fatalf("%s: ended %+v, want KILL", g.Tuple.Allocation, st)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: command still runs 30 s after its grant went away", g.Tuple.Allocation)
		}
	}
	if out := f.output(f.grant, keep); out.Exit != nil {
		t.Fatalf("a command whose grant stayed was killed: %+v", out.Exit)
	}
}

// TestStaleTerminalsMakeRoom: a full table evicts finished terminals older
// than TerminalRetention, never running or recent ones.
func TestStaleTerminalsMakeRoom(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{Limits: Limits{MaxTerminals: 2}})
	old := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/true"}})
	f.wait(f.grant, old)
	running := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sleep", "100"}})
	if _, err := f.call(f.grant, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}}); code(err) != errcode.CodeDenied {
		t.Fatalf("full table with a recent finished terminal: %v", err)
	}
	f.clk.Advance(TerminalRetention + time.Second)
	f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/true"}})
	if _, err := f.call(f.grant, wire.OpExecOutput, wire.TerminalArgs{TerminalID: old}); code(err) != errcode.CodeNotFound {
		t.Fatalf("stale terminal kept: %v", err)
	}
	if out := f.output(f.grant, running); out.Exit != nil {
		t.Fatalf("running terminal disturbed: %+v", out)
	}
}

// TestMaxProcsUnderConcurrentStarts: 16 simultaneous exec_starts under
// max_procs 2 start exactly 2 commands.
func TestMaxProcsUnderConcurrentStarts(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	two := f.newGrant("two", allOps...)
	two.Limits.MaxProcs = 2
	f.publish(f.grant, two)
	var wg sync.WaitGroup
	var started, denied atomic.Int32
	for range 16 {
		wg.Go(func() {
			_, err := f.call(two, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/sleep", "100"}})
			switch code(err) {
			case "":
				started.Add(1)
			case errcode.CodeDenied:
				denied.Add(1)
			default:
				t.Errorf("exec_start: %v", err)
			}
		})
	}
	wg.Wait()
	if started.Load() != 2 || denied.Load() != 14 {
		t.Fatalf("%d started, %d denied; want 2 and 14", started.Load(), denied.Load())
	}
	if n := len(procsOfUID(t, gUID)); n != 2 {
		t.Fatalf("%d processes of the grant uid, want 2", n)
	}
}

// TestLookPathAsGrantUser attacks the PATH lookup through exec_start: a
// command in a 0700 root directory exists, yet it is answered exactly like
// a missing one (the receiver's own privileges never show the caller a
// file the grant's user cannot reach), while a directory the user can
// search works. A not-found start ran nothing, so its op key stays usable.
func TestLookPathAsGrantUser(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	bin := []byte("#!/bin/sh\nexit 0\n") // a script: /bin/true is a busybox link in the CI guest
	mkdir := func(name string, mode os.FileMode) string {
		d := filepath.Join(f.base, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "probe"), bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	hidden, open := mkdir("hidden", 0o700), mkdir("open", 0o755)
	start := func(key, cmd, path string) (any, error) {
		raw, _ := json.Marshal(wire.ExecStartArgs{Argv: []string{cmd}, Env: map[string]string{"PATH": path}})
		return f.h.Serve(context.Background(), &wire.Request{ID: uint64(f.seq.Add(1)), Op: wire.OpExecStart,
			TupleSHA256: f.grant.Tuple.SHA256(), OpKey: key, Deadline: f.clk.Now().Add(30 * time.Second), Args: raw})
	}
	_, errHidden := start("k-hidden", "probe", hidden)
	_, errAbsent := start("k-absent", "absent", hidden)
	if code(errHidden) != errcode.CodeNotFound || code(errAbsent) != errcode.CodeNotFound {
		t.Fatalf("hidden: %v; absent: %v; want not_found for both", errHidden, errAbsent)
	}
	if a, b := strings.ReplaceAll(errHidden.Error(), "probe", "X"), strings.ReplaceAll(errAbsent.Error(), "absent", "X"); a != b {
		t.Fatalf("a hidden command is told apart from a missing one:\n%s\n%s", a, b)
	}
	res, err := start("k-hidden", "probe", hidden+":"+open) // the same op key: nothing ran the first time
	if err != nil {
		t.Fatalf("probe through %s: %v", open, err)
	}
	if w := f.wait(f.grant, res.(*wire.ExecStartResult).TerminalID); exitCode(w.Exit) != 0 {
		t.Fatalf("probe: %+v", w.Exit)
	}
	if _, err := start("k-hidden", "probe", open); code(err) != errcode.CodeOpKeyConflict {
		t.Fatalf("op key reused after a command ran: %v, want op_key_conflict", err)
	}
}

// TestOutputFinalWhenPipeOutlivesGroup: a process that left the command's
// group (setsid) keeps the output pipe open after the command exits, so no
// end of file comes. exec_wait still answers once the command is reaped
// and the output grace has passed (while that process still runs), and the
// output is final from then on.
func TestOutputFinalWhenPipeOutlivesGroup(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	t.Cleanup(func() { // the escaped sleeper is the grant uid's; end it for later tests
		for _, p := range procsOfUID(t, gUID) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})
	// The command waits until the background process has left the group
	// (it creates a file after setsid), so the group kill cannot race it.
	script := `setsid sh -c 'touch escaped; exec sleep 30' & while [ ! -e escaped ]; do :; done; echo done`
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", script},
		Env: map[string]string{"PATH": "/usr/bin:/bin"}})
	if w := f.wait(f.grant, id); exitCode(w.Exit) != 0 {
		t.Fatalf("exit %+v", w.Exit)
	}
	if len(procsOfUID(t, gUID)) == 0 {
		t.Fatal("the escaped process is gone: the test did not exercise an open pipe")
	}
	first := f.output(f.grant, id)
	if first.Output != "done\n" {
		t.Fatalf("output %q", first.Output)
	}
	if again := f.output(f.grant, id); again.Output != first.Output || again.Truncated != first.Truncated {
		t.Fatalf("output changed after the terminal was final: %q then %q", first.Output, again.Output)
	}
}

// TestReleaseAnswersTimeoutUntilFinal: exec_release answers success only
// once the terminal is final. Here the leader's output pipe is held by a
// setsid escapee (containment off), so the terminal is final only after
// the output grace; a release whose request ends before that answers
// timeout, and the terminal is forgotten and still becomes final.
func TestReleaseAnswersTimeoutUntilFinal(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	t.Cleanup(func() { // the escaped sleeper is the grant uid's; end it for later tests
		for _, p := range procsOfUID(t, gUID) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})
	script := `setsid sh -c 'touch escaped; exec sleep 30' & while [ ! -e escaped ]; do :; done; echo done; exec sleep 100`
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", script},
		Env: map[string]string{"PATH": "/usr/bin:/bin"}})
	tm := f.h.terms.get(f.grant.Tuple.SHA256(), id)
	waitOutput(t, tm, "done\n")
	ctx, cancel := context.WithTimeout(context.Background(), outputGrace/5)
	defer cancel()
	_, err := f.callCtx(ctx, f.grant.Tuple.SHA256(), wire.OpExecRelease, wire.TerminalArgs{TerminalID: id},
		f.clk.Now().Add(30*time.Second))
	if code(err) != errcode.CodeTimeout {
		t.Fatalf("release before the terminal is final: %v, want timeout", err)
	}
	if f.h.terms.get(f.grant.Tuple.SHA256(), id) != nil {
		t.Fatal("the terminal is still known after release")
	}
	select {
	case <-tm.done:
	case <-time.After(30 * time.Second): // a bound for a slow guest, not a wait
		t.Fatal("the released terminal never became final")
	}
}

// TestWaitCarriesFinalOutput: one exec_wait answers the exit, the
// after-exit digests and the whole output; with release it forgets the
// terminal in the same exchange, and release is refused on other ops.
// exec_output after the exit carries the digests too.
func TestWaitCarriesFinalOutput(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"sh", "-c", `printf 'a\nb'; printf x > made; exit 2`},
		HashAfterExit: []string{"made"}})
	if _, err := f.call(f.grant, wire.OpExecOutput, wire.TerminalArgs{TerminalID: id, Release: true}); code(err) != errcode.CodeInvalid {
		t.Fatalf("exec_output with release: %v, want invalid", err)
	}
	sum := sha256.Sum256([]byte("x"))
	res, err := f.call(f.grant, wire.OpExecWait, wire.TerminalArgs{TerminalID: id})
	if err != nil {
		t.Fatal(err)
	}
	w := res.(*wire.ExecWaitResult)
	if w.Output == nil || *w.Output != "a\nb" || w.Truncated || exitCode(w.Exit) != 2 || w.Released ||
		w.FileSHA256["made"] != hex.EncodeToString(sum[:]) {
		t.Fatalf("exec_wait = %+v", w)
	}
	if out := f.output(f.grant, id); out.FileSHA256["made"] != hex.EncodeToString(sum[:]) {
		t.Fatalf("exec_output after exit: digests %v", out.FileSHA256)
	}
	res, err = f.call(f.grant, wire.OpExecWait, wire.TerminalArgs{TerminalID: id, Release: true})
	if err != nil {
		t.Fatal(err)
	}
	if w := res.(*wire.ExecWaitResult); !w.Released || w.Output == nil || *w.Output != "a\nb" {
		t.Fatalf("exec_wait with release = %+v", w)
	}
	if _, err := f.call(f.grant, wire.OpExecOutput, wire.TerminalArgs{TerminalID: id}); code(err) != errcode.CodeNotFound {
		t.Fatalf("exec_output after a releasing wait: %v, want not_found", err)
	}
}

// TestWaitLeavesOutOutputThatDoesNotFit: output whose encoding passes the
// result bound beside the digests is left out (Output nil), and the
// terminal is then kept even with release, so exec_output can give it.
func TestWaitLeavesOutOutputThatDoesNotFit(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{Limits: Limits{MaxResultBytes: 65536}})
	// 20000 control bytes encode as \u0001 each: 120000 bytes of JSON.
	id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"sh", "-c", `head -c 20000 /dev/zero | tr '\0' '\1'`}})
	res, err := f.call(f.grant, wire.OpExecWait, wire.TerminalArgs{TerminalID: id, Release: true})
	if err != nil {
		t.Fatal(err)
	}
	if w := res.(*wire.ExecWaitResult); w.Output != nil || w.Released || exitCode(w.Exit) != 0 {
		t.Fatalf("exec_wait = %+v, want the exit without output, not released", w)
	}
	if out := f.output(f.grant, id); len(out.Output) != 20000 {
		t.Fatalf("exec_output after: %d bytes", len(out.Output))
	}
}
