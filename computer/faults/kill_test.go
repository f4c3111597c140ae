package faults

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/fixtures/bins"
)

// killCase is one window in which the daemon is SIGKILLed: the step it
// pauses at, the operation that reaches it (on target, "" for a create),
// and the state the next daemon must record for the target.
type killCase struct {
	name, step string
	ttl        int64 // the target's lease
	op         func(ctx context.Context, e *env, target string) error
	want       string
}

func killCases() []killCase {
	create := func(ctx context.Context, e *env, _ string) error {
		_, err := e.cl.Create(ctx, api.CreateRequest{LeaseTTLSeconds: 600})
		return err
	}
	del := func(ctx context.Context, e *env, id string) error { return e.cl.Delete(ctx, id) }
	expire := func(ctx context.Context, e *env, id string) error { <-ctx.Done(); return ctx.Err() }
	suspend := func(ctx context.Context, e *env, id string) error { _, err := e.cl.Suspend(ctx, id); return err }
	return []killCase{
		{"create/before-prepare", service.StepCreateRecorded, 0, create, api.StateFailed},
		{"create/after-prepare", service.StepCreatePrepared, 0, create, api.StateFailed},
		{"delete/before-withdraw", service.StepEndRecorded, 600, del, api.StateDeleted},
		{"lease-expiry/between-withdraw-and-kill", service.StepEndWithdrawn, 2, expire, api.StateDeleted},
		{"delete/between-kill-and-close", service.StepEndKilled, 600, del, api.StateDeleted},
		{"suspend/before-freeze", service.StepSuspendRecorded, 600, suspend, api.StateSuspended},
	}
}

// TestIntegrationDaemonKilledMidOperation SIGKILLs the real daemon at
// each named step of create, teardown (delete and lease expiry) and
// suspend, with a bystander computer running, and starts a new one on
// the same directory. Then nothing is left of any ended computer (its
// uid's processes and IPC, its cgroups, loop device, mounts, directory)
// and every record is true on the host: the bystander runs a command,
// the target is failed or deleted with nothing left, or suspended and
// frozen (and runs a command once resumed). The positive control: just
// before each kill the same checks do find what the half-done operation
// holds.
func TestIntegrationDaemonKilledMidOperation(t *testing.T) {
	for _, kc := range killCases() {
		t.Run(kc.name, func(t *testing.T) { killMidOperation(t, kc) })
	}
}

func killMidOperation(t *testing.T, kc killCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := newEnv(ctx, t)
	d := e.start(ctx, t, "")
	bystander := mustCreate(ctx, t, e, 600)
	d.stop(t)
	d = e.start(ctx, t, kc.step)
	target := ""
	if kc.ttl > 0 {
		target = mustCreate(ctx, t, e, kc.ttl).ID
	}
	opCtx, opCancel := context.WithCancel(ctx)
	opDone := make(chan error, 1)
	go func() { opDone <- kc.op(opCtx, e, target) }()
	d.awaitPause(ctx, t, kc.step)
	e.seen.scan()
	byDir := dirOf(t, e, bystander)
	found := leaks(e.seen, map[string]bool{byDir: true})
	if kc.step != service.StepCreateRecorded && len(found) == 0 {
		t.Errorf("positive control: at %s the leak checks find nothing of the target", kc.step)
	}
	t.Logf("paused at %s; the leak checks find %d things held: %q", kc.step, len(found), found)
	d.kill()
	opCancel()
	if err := <-opDone; err == nil && kc.ttl == 0 {
		t.Errorf("the create answered although the daemon was killed at %s", kc.step)
	}

	e.start(ctx, t, "")
	live := checkRecordsTrue(ctx, t, e)
	if target == "" {
		target = theOther(ctx, t, e, bystander.ID)
	}
	got, err := e.cl.Get(ctx, target)
	if err != nil || got.State != kc.want {
		t.Errorf("target %s after the restart: %v, state %q (%s); want %s", target, err, got.State, got.Reason, kc.want)
	}
	t.Logf("after the restart the target is %s (%s)", got.State, got.Reason)
	if !live[byDir] {
		t.Errorf("the bystander %s is not running after the restart", bystander.ID)
	}
	checkNothingLeft(t, e.seen, live)
	if kc.want == api.StateSuspended {
		checkResumes(ctx, t, e, target)
	}
	endAll(ctx, t, e)
	verifyLog(ctx, t, e)
}

// mustCreate creates a running computer with a lease of ttl seconds.
func mustCreate(ctx context.Context, t *testing.T, e *env, ttl int64) api.Computer {
	t.Helper()
	c, err := e.cl.Create(ctx, api.CreateRequest{LeaseTTLSeconds: ttl})
	if err != nil || c.State != api.StateRunning || c.Tuple == nil {
		t.Fatalf("create: %v (%+v)", err, c)
	}
	return c
}

// dirOf is the directory of a made computer.
func dirOf(t *testing.T, e *env, c api.Computer) string {
	t.Helper()
	e.seen.scan()
	st, ok := e.seen.bySandbox(c.Tuple.Sandbox)
	if !ok {
		t.Fatalf("no state file of %s (sandbox %s)", c.ID, c.Tuple.Sandbox)
	}
	return st.Dir
}

// theOther returns the one computer listed besides id.
func theOther(ctx context.Context, t *testing.T, e *env, id string) string {
	t.Helper()
	cs, err := e.cl.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for _, c := range cs {
		if c.ID != id {
			others = append(others, c.ID)
		}
	}
	if len(others) != 1 {
		t.Fatalf("want one computer besides %s, the daemon lists %v", id, others)
	}
	return others[0]
}

// checkResumes resumes id and runs a command in it.
func checkResumes(ctx context.Context, t *testing.T, e *env, id string) {
	t.Helper()
	c, err := e.cl.Resume(ctx, id)
	if err != nil || c.State != api.StateRunning {
		t.Fatalf("resume %s: %v (state %q)", id, err, c.State)
	}
	if m := adopt(ctx, t, e, dirOf(t, e, c)); m != nil {
		if out := runCommand(ctx, t, m, "echo resumed"); !strings.Contains(out, "resumed") {
			t.Errorf("a command in the resumed %s printed %q", id, out)
		}
	}
}

// endAll deletes every computer still made, stops the daemon, lets a
// last one without a pool clean the pool, and checks nothing at all is
// left.
func endAll(ctx context.Context, t *testing.T, e *env) {
	t.Helper()
	cs, err := e.cl.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.State == api.StateRunning || c.State == api.StateSuspended {
			if err := e.cl.Delete(ctx, c.ID); err != nil {
				t.Errorf("delete %s: %v", c.ID, err)
			}
		}
	}
	e.d.stop(t)
	e.start(ctx, t, "", "--pool", "0").stop(t)
	checkNothingLeft(t, e.seen, nil)
}

// verifyLog runs `tether-computer verify` on the state directory.
func verifyLog(ctx context.Context, t *testing.T, e *env) {
	t.Helper()
	out, err := exec.CommandContext(ctx, e.b.Path(bins.Computer), "verify", "--dir", e.state()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "chain intact") {
		t.Errorf("verify %s: %v\n%s", filepath.Base(e.state()), err, out)
	}
}
