package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/fixtures/etcdtest"
)

// The stderr lines the bind-retry tests wait for.
const (
	heldLine  = "test-agent: initialize held"
	retryLine = "op store unavailable, retrying"
)

// heldRun is a `tether-custodian run` whose test agent holds its answer
// to initialize until the test opens its gate: the custodian has opened
// the op store (and a standby taken the session over) but not bound yet.
type heldRun struct {
	cmd        *exec.Cmd
	gate       string
	errs, outs *lineLog
	exited     chan struct{}
	err        error // set before exited is closed
}

// How a held run binds its session.
type bindMode int

const (
	bindNew     bindMode = iota // session/new: the agent names the session
	bindLoad                    // --session-id: session/load
	bindStandby                 // --standby --session-id: take over, then session/load
)

// startHeld starts run (binding as mode says) for session sess, its
// one prompt appending word to ROOT/side-word under op key word (the
// receiver keeps op keys per tuple, which the tests share), and waits
// until the agent holds initialize.
func startHeld(t *testing.T, dir, cfg, sess, word string, mode bindMode) *heldRun {
	t.Helper()
	args := []string{"run", "--no-jail", "--config", cfg,
		"--prompt", fmt.Sprintf("key=%s sh echo %s >> ROOT/side-%s", word, word, word)}
	switch mode {
	case bindLoad:
		args = append(args, "--session-id", sess)
	case bindStandby:
		args = append(args, "--standby", "--session-id", sess)
	}
	args = append(args, "--", "test-agent")
	h := &heldRun{cmd: exec.Command("tether-custodian", args...), gate: filepath.Join(dir, "gate-"+word), exited: make(chan struct{})}
	h.cmd.Dir = dir
	h.cmd.Env = append(os.Environ(), "TEST_AGENT_HOLD_INIT="+h.gate, "TEST_AGENT_SESSION="+sess)
	h.errs, h.outs = newLineLog(t, h.cmd, true), newLineLog(t, h.cmd, false)
	realrecv.Must(t, h.cmd.Start())
	go func() {
		<-h.errs.done
		<-h.outs.done
		h.err = h.cmd.Wait()
		close(h.exited)
	}()
	t.Cleanup(func() {
		h.cmd.Process.Kill()
		<-h.exited
		t.Logf("run (%s) stdout:\n%s\nstderr:\n%s", word, h.outs, h.errs)
	})
	waitFor(t, time.Minute, "the agent holds initialize", func() bool { return !h.errs.when(heldLine).IsZero() || h.done() })
	if h.done() {
		t.Fatalf("run (%s) ended before its bind: %v", word, h.err)
	}
	return h
}

// done reports whether the run exited.
func (h *heldRun) done() bool {
	select {
	case <-h.exited:
		return true
	default:
		return false
	}
}

// release lets the agent answer initialize: the run binds next.
func (h *heldRun) release(t *testing.T) {
	t.Helper()
	realrecv.Must(t, os.WriteFile(h.gate, nil, 0o600))
}

// wait returns the run's exit error once it exited, failing after within.
func (h *heldRun) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-h.exited:
		return h.err
	case <-time.After(within):
		t.Fatalf("run did not exit within %s", within)
		return nil
	}
}

// loseQuorum stops two of the cluster's three members, keeping their
// data: etcd answers nothing that needs a leader until they are back.
func loseQuorum(c *etcdtest.Cluster) {
	c.Stop(0)
	c.Stop(1)
}

// regainQuorum restarts the stopped members and waits until every
// member answers a linearizable read.
func regainQuorum(t *testing.T, c *etcdtest.Cluster) {
	t.Helper()
	realrecv.Must(t, c.Restart(0))
	realrecv.Must(t, c.Restart(1))
	realrecv.Must(t, c.WaitHealthy(context.Background(), time.Minute))
}

// TestIntegrationFleetRunBindWaitsOutEtcd loses etcd's quorum (two of
// three real members stopped, data kept) while `tether-custodian run`
// (session/new, whose first op-store step is the claim; --session-id,
// whose first is the lease record), then `run --standby`, is about to
// bind its session, lets it bind, waits
// for its stderr to show that it met the op store unavailable and
// retries, brings the members back and checks that the run then binds,
// runs its one command exactly once and exits 0. The ownership lease
// (30 s) outlives the outage, so the run keeps its lease throughout.
// Without the retry, the run exits at the first unavailable answer.
func TestIntegrationFleetRunBindWaitsOutEtcd(t *testing.T) {
	rr := realrecv.Start(t)
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	prefix := "/fleet-retry/" + filepath.Base(dir) + "/"
	for _, tc := range []struct {
		word string
		mode bindMode
	}{{"new", bindNew}, {"load", bindLoad}, {"standby", bindStandby}} {
		t.Run(tc.word, func(t *testing.T) {
			cfg := fleetRunConfigWith(t, rr, c, dir, "custodian-"+tc.word, prefix,
				map[string]any{"lease_ttl_s": 30, "unavailable_wait_s": 60})
			h := startHeld(t, dir, cfg, "sess-retry-"+tc.word, tc.word, tc.mode)
			if tc.mode == bindStandby && h.errs.when("took session sess-retry-standby over").IsZero() {
				t.Fatal("the standby holds initialize before it took the session over")
			}
			loseQuorum(c)
			h.release(t)
			waitFor(t, time.Minute, "the run logs a retry of its bind", func() bool { return !h.errs.when(retryLine).IsZero() || h.done() })
			if h.done() {
				regainQuorum(t, c)
				t.Fatalf("run ended while etcd had no quorum instead of waiting: %v", h.err)
			}
			regainQuorum(t, c)
			if err := h.wait(t, 2*time.Minute); err != nil {
				t.Fatalf("run after etcd came back: %v", err)
			}
			if h.outs.when("ok exec exit=0").IsZero() {
				t.Fatal("the prompt's command did not run")
			}
			data, err := os.ReadFile(rr.File("side-" + tc.word))
			realrecv.Must(t, err)
			if got := strings.Fields(string(data)); len(got) != 1 || got[0] != tc.word {
				t.Fatalf("side effects %q, want the command's line exactly once", got)
			}
			log, err := os.ReadFile(filepath.Join(dir, "state-custodian-"+tc.word, "audit", "log"))
			realrecv.Must(t, err)
			if n := strings.Count(string(log), `"kind":"claim"`); n != 1 {
				t.Fatalf("%d claim records in the audit log, want the one claim", n)
			}
		})
	}
}

// TestIntegrationFleetRunBindGivesUpAtBound keeps etcd without quorum
// while `tether-custodian run` binds with unavailable_wait_s 8: the run
// must retry (a try ends after 5 s without an answer), give up after
// about 8 s (not at once, not after its 30 s lease), exit 1 naming the
// bind, the op store and the bound, and run nothing.
func TestIntegrationFleetRunBindGivesUpAtBound(t *testing.T) {
	rr := realrecv.Start(t)
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	prefix := "/fleet-retry-bound/" + filepath.Base(dir) + "/"
	const bound = 8 * time.Second
	cfg := fleetRunConfigWith(t, rr, c, dir, "custodian-bound", prefix,
		map[string]any{"lease_ttl_s": 30, "unavailable_wait_s": int(bound / time.Second)})
	h := startHeld(t, dir, cfg, "sess-retry-bound", "bound", bindLoad)
	loseQuorum(c)
	released := time.Now()
	h.release(t)
	// The exit follows the give-up line by the lease revocation Close
	// tries (concurrency.Session bounds it by the lease TTL).
	err := h.wait(t, 2*time.Minute)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitFailed {
		t.Fatalf("run with etcd down: %v, want exit %d", err, exitFailed)
	}
	gaveUp := h.errs.when("giving up at the bound (op_store unavailable_wait_s, 8s)")
	if gaveUp.IsZero() {
		t.Fatal("stderr does not say the run gave up at the bound")
	}
	if took := gaveUp.Sub(released); took < bound || took > bound+10*time.Second {
		t.Fatalf("run gave up %s after its bind began, bound %s", took, bound)
	}
	for _, want := range []string{"run: bind:", "the op store answered unavailable for"} {
		if h.errs.when(want).IsZero() {
			t.Fatalf("stderr lacks %q", want)
		}
	}
	if h.errs.when(retryLine).IsZero() {
		t.Fatal("no retry was logged before giving up")
	}
	if _, err := os.Stat(rr.File("side-bound")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the prompt's command ran although the bind failed: %v", err)
	}
}
