package faults

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/receiver/wire"
)

// answerBound is how fast the receiver and the daemon must answer about
// a frozen computer.
const answerBound = time.Second

// TestIntegrationFrozenComputerCannotStallHost suspends (through the
// daemon's API) a computer whose command is a busy loop. The positive
// control: the loop burns CPU before the suspend, and none while
// suspended, so the answers that follow come from a computer that really
// is frozen. While it is, its receiver answers an attach, a file read,
// the loop's output and a kill of the loop, and the daemon a Get, each
// within answerBound; then a delete returns, the loop is gone and
// nothing of the computer is left.
func TestIntegrationFrozenComputerCannotStallHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := newEnv(ctx, t)
	e.start(ctx, t, "")
	comp := mustCreate(ctx, t, e, 600)
	dir := dirOf(t, e, comp)
	m := adopt(ctx, t, e, dir)
	if m == nil {
		t.FailNow()
	}
	note := "note.txt" // relative to the grant root
	call := func(ctx context.Context, wc wireCaller, op wire.Op, args, res any) error {
		return wc.Call(ctx, op, m.Tuple().SHA256(), opKey(), time.Now().Add(time.Minute), args, res)
	}
	id, wc := startCommand(ctx, t, m, "echo spinning; while :; do :; done")
	if wc == nil {
		t.FailNow()
	}
	var wr wire.WriteResult
	if err := call(ctx, wc, wire.OpWrite, wire.WriteArgs{Path: note, Content: "still here\n"}, &wr); err != nil {
		t.Fatalf("write %s: %v", note, err)
	}
	pid := loopPID(ctx, t, m)
	ticks := awaitCPU(ctx, t, pid, cpuTicks(t, pid)+5) // the control: it spins

	if c, err := e.cl.Suspend(ctx, comp.ID); err != nil || c.State != api.StateSuspended {
		t.Fatalf("suspend: %v (state %q)", err, c.State)
	}
	frozen := cpuTicks(t, pid)
	slowest, rounds := time.Duration(0), 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); rounds++ {
		for name, ask := range map[string]func(context.Context) error{
			"attach": func(ctx context.Context) error { _, err := provision.AttachVia(ctx, m.Local(), m.Tuple()); return err },
			"read": func(ctx context.Context) error {
				var r wire.ReadResult
				if err := call(ctx, wc, wire.OpRead, wire.ReadArgs{Path: note}, &r); err != nil || r.Content != "still here\n" {
					return fmt.Errorf("%q, %w", r.Content, err)
				}
				return nil
			},
			"exec_output": func(ctx context.Context) error {
				var o wire.ExecOutputResult
				return call(ctx, wc, wire.OpExecOutput, wire.TerminalArgs{TerminalID: id}, &o)
			},
			"daemon get": func(ctx context.Context) error { _, err := e.cl.Get(ctx, comp.ID); return err },
		} {
			slowest = max(slowest, answers(ctx, t, name, ask))
		}
	}
	if after := cpuTicks(t, pid); after != frozen {
		t.Fatalf("control: the suspended loop used CPU (%d ticks became %d)", frozen, after)
	}
	slowest = max(slowest, answers(ctx, t, "exec_kill", func(ctx context.Context) error {
		return call(ctx, wc, wire.OpExecKill, wire.TerminalArgs{TerminalID: id}, &wire.Empty{})
	}))
	t.Logf("the loop spun %d ticks, then none while frozen; %d rounds of answers, the slowest %s", ticks, rounds, slowest)
	wc.Close()

	start := time.Now()
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	if err := e.cl.Delete(dctx, comp.ID); err != nil {
		t.Fatalf("delete the frozen computer: %v", err)
	}
	t.Logf("delete of the frozen computer took %s", time.Since(start).Round(time.Millisecond))
	if c, err := e.cl.Get(ctx, comp.ID); err != nil || c.State != api.StateDeleted {
		t.Errorf("after the delete: %v, state %q (%s)", err, c.State, c.Reason)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("the busy loop %d still runs after the delete", pid)
	}
	checkNothingLeft(t, e.seen, nil)
	endAll(ctx, t, e)
}

// answers runs ask with answerBound and fails the test when it errs or
// is late; it returns how long it took.
func answers(ctx context.Context, t *testing.T, name string, ask func(context.Context) error) time.Duration {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, answerBound)
	defer cancel()
	start := time.Now()
	err := ask(actx)
	took := time.Since(start)
	if err != nil || took > answerBound {
		t.Errorf("%s about the frozen computer: %v after %s (bound %s)", name, err, took, answerBound)
	}
	return took
}

// loopPID waits for the busy loop (bash, as the computer's uid) and
// returns its host pid.
func loopPID(ctx context.Context, t *testing.T, m *provision.Machine) int {
	t.Helper()
	uid := m.Local().State().UID
	for ctx.Err() == nil {
		ps, _ := provision.ProcessesOf(uid)
		for _, p := range ps {
			if p.Comm == "bash" {
				return p.HostPID
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no bash of uid %d appeared", uid)
	return 0
}

// cpuTicks is pid's user and system time, in clock ticks.
func cpuTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, err1 := strconv.ParseUint(f[11], 10, 64) // utime, field 14
	s, err2 := strconv.ParseUint(f[12], 10, 64) // stime, field 15
	if err1 != nil || err2 != nil {
		t.Fatalf("parse /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return u + s
}

// awaitCPU waits (at most 30 s) until pid has used want ticks.
func awaitCPU(ctx context.Context, t *testing.T, pid int, want uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := cpuTicks(t, pid)
		if got >= want {
			return got
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("control: the loop %d used %d ticks, never %d", pid, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
