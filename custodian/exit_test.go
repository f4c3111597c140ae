package custodian

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/custodian/opstore"
)

// hookedSession is an in-process custodian, with a test hook, bound
// through the test agent to a real receiver process.
type hookedSession struct {
	rr    *realReceiver
	c     *Custodian
	agent *acp.AgentSideConnection
	run   string // op key prefix, unique per session
}

func newHookedSession(t *testing.T, rr *realReceiver, hook func(ctx context.Context, method, step string)) *hookedSession {
	t.Helper()
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	c, err := New(Options{StateDir: filepath.Join(t.TempDir(), "state"), AuditKey: []byte(skey)})
	must(t, err)
	c.hook = hook
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	agent := &testAgent{sessionID: "sess-hooked", attachOnNew: true}
	g := &testagent.Gate{R: c2aR, Ready: make(chan struct{})}
	agent.conn = acp.NewAgentSideConnection(agent, a2cW, g)
	close(g.Ready)
	recv := NewReceiver(rr.dialer(), Backoff{}, nil)
	conn := c.Serve(c2aW, a2cR, ConnOptions{})
	t.Cleanup(func() {
		c2aW.Close()
		a2cW.Close()
		conn.Close()
		recv.Close()
		if err := c.Close(); err != nil {
			t.Errorf("custodian Close: %v", err)
		}
	})
	ctx := context.Background()
	_, err = conn.Initialize(ctx)
	must(t, err)
	_, err = conn.NewSession(ctx, acp.NewSessionRequest{Cwd: rr.tuple.Root, McpServers: []acp.McpServer{}},
		Binding{Tuple: rr.tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: "alice", Receiver: recv})
	must(t, err)
	if agent.attachErr != nil {
		t.Fatal(agent.attachErr)
	}
	return &hookedSession{rr: rr, c: c, agent: agent.conn, run: newKey("x")}
}

func (s *hookedSession) meta(key string) map[string]any {
	return acpmeta.Op{TupleSHA256: s.rr.tuple.SHA256(), OpKey: s.run + "-" + key, Deadline: time.Now().Add(time.Minute)}.Meta()
}

func (s *hookedSession) receipt(t *testing.T, key string) *opstore.Receipt {
	t.Helper()
	raw, err := s.c.store.Get(opstore.Key(s.rr.tuple.SHA256(), "sess-hooked", s.run+"-"+key))
	must(t, err)
	r, err := opstore.Unmarshal(raw)
	must(t, err)
	return r
}

// cancelAtExitObserved returns a hook that, the first time method observes
// an exit, cancels the agent's request (through cancel) and waits until
// the custodian's handler sees the cancel: the agent gave up on the call
// just after the receiver answered it. fired reports that it did.
func cancelAtExitObserved(t *testing.T, method string, cancel *func()) (hook func(context.Context, string, string), fired *atomic.Bool) {
	var once sync.Once
	fired = &atomic.Bool{}
	return func(ctx context.Context, m, step string) {
		if m != method || step != "exit-observed" {
			return
		}
		once.Do(func() {
			fired.Store(true)
			(*cancel)()
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				t.Errorf("the agent's cancel of %s never reached the custodian", method)
			}
		})
	}, fired
}

// TestIntegrationKilledExitRecordedWhenOutputIsCancelled: a command is
// killed; terminal/output shows its exit (signal KILL), and the agent
// cancels that output request just after the receiver answered it. The
// exit was observed before the release, so the create receipt must record
// it (failed, signal KILL), never "released before its exit was observed".
// Before the fix the receipt was completed by a second receiver call made
// with the cancelled request's context, which failed.
func TestIntegrationKilledExitRecordedWhenOutputIsCancelled(t *testing.T) {
	rr := startReceiver(t)
	for _, verify := range []bool{false, true} {
		t.Run(fmt.Sprintf("verify=%v", verify), func(t *testing.T) {
			cancelOutput := func() {}
			hook, fired := cancelAtExitObserved(t, acp.ClientMethodTerminalOutput, &cancelOutput)
			s := newHookedSession(t, rr, hook)
			ctx := context.Background()
			meta := s.meta("create")
			if verify {
				meta = acpmeta.MergeMeta(meta, acpmeta.Verify{Files: map[string]string{"never.txt": sha256Hex(nil)}}.Meta())
			}
			term, err := s.agent.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: "sess-hooked", Command: "/bin/sleep",
				Args: []string{"30"}, Cwd: &rr.tuple.Root, Meta: meta})
			must(t, err)
			_, err = s.agent.KillTerminal(ctx, acp.KillTerminalRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId, Meta: s.meta("kill")})
			must(t, err)
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; !fired.Load(); i++ {
				if time.Now().After(deadline) {
					t.Fatal("terminal/output never showed the killed command's exit")
				}
				octx, cancel := context.WithCancel(ctx)
				cancelOutput = cancel
				out, err := s.agent.TerminalOutput(octx, acp.TerminalOutputRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId,
					Meta: s.meta(fmt.Sprintf("output-%d", i))})
				cancel()
				switch {
				case fired.Load() && err == nil:
					t.Fatal("the output the agent cancelled answered without an error")
				case fired.Load():
				case err != nil:
					t.Fatal(err)
				case out.ExitStatus != nil:
					t.Fatal("output showed the exit without the hook cancelling it")
				default:
					time.Sleep(5 * time.Millisecond)
				}
			}
			waitNotPending(t, s, "create")
			_, err = s.agent.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId, Meta: s.meta("release")})
			must(t, err)
			r := s.receipt(t, "create")
			if r.Outcome != opstore.Failed || r.Exit == nil || r.Exit.Signal != "KILL" || r.Note == noteReleasedUnobserved {
				t.Fatalf("receipt %s, exit %+v, note %q: want failed by signal KILL (the exit output showed)", r.Outcome, r.Exit, r.Note)
			}
			if verify && (len(r.Files) != 1 || r.Files[0].Path != "never.txt") {
				t.Fatalf("verified exec's file checks %+v", r.Files)
			}
		})
	}
}

// waitNotPending gives the custodian's handler time to record the exit
// after the agent gave up on its request.
func waitNotPending(t *testing.T, s *hookedSession, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.receipt(t, key).Outcome == opstore.Pending && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// TestIntegrationWaitExitRecordedWhenWaitIsCancelled: the agent cancels
// terminal/wait_for_exit just after the receiver answered it; the receipt
// still records the exit the custodian observed.
func TestIntegrationWaitExitRecordedWhenWaitIsCancelled(t *testing.T) {
	rr := startReceiver(t)
	cancelWait := func() {}
	hook, fired := cancelAtExitObserved(t, acp.ClientMethodTerminalWaitForExit, &cancelWait)
	s := newHookedSession(t, rr, hook)
	ctx := context.Background()
	term, err := s.agent.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: "sess-hooked", Command: "/bin/sh",
		Args: []string{"-c", "exit 3"}, Cwd: &rr.tuple.Root, Meta: s.meta("create")})
	must(t, err)
	wctx, cancel := context.WithCancel(ctx)
	cancelWait = cancel
	if _, err := s.agent.WaitForTerminalExit(wctx, acp.WaitForTerminalExitRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId,
		Meta: s.meta("wait")}); err == nil || !fired.Load() {
		t.Fatalf("wait: %v, hook fired %v; want the hook to cancel the wait after the answer", err, fired.Load())
	}
	waitNotPending(t, s, "create")
	_, err = s.agent.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId, Meta: s.meta("release")})
	must(t, err)
	r := s.receipt(t, "create")
	if r.Outcome != opstore.Failed || r.Exit == nil || r.Exit.ExitCode == nil || *r.Exit.ExitCode != 3 {
		t.Fatalf("receipt %s, exit %+v, note %q: want failed with exit 3", r.Outcome, r.Exit, r.Note)
	}
}

// TestIntegrationReleaseBeforeExitObserved: a release with no exit
// observed leaves the receipt failed, saying so, with no exit invented.
func TestIntegrationReleaseBeforeExitObserved(t *testing.T) {
	rr := startReceiver(t)
	s := newHookedSession(t, rr, nil)
	ctx := context.Background()
	lines := "pid-" + s.run
	term, err := s.agent.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: "sess-hooked", Command: "/bin/sh",
		Args: []string{"-c", "echo $$ >> " + lines + "; exec /bin/sleep 30"}, Cwd: &rr.tuple.Root, Meta: s.meta("create")})
	must(t, err)
	pid := waitPid(t, rr.file(lines))
	_, err = s.agent.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId, Meta: s.meta("release")})
	must(t, err)
	if syscall.Kill(pid, 0) == nil {
		t.Fatal("the released command still runs")
	}
	r := s.receipt(t, "create")
	if r.Outcome != opstore.Failed || r.Exit != nil || r.Note != noteReleasedUnobserved {
		t.Fatalf("receipt %s, exit %+v, note %q: want failed, no exit, %q", r.Outcome, r.Exit, r.Note, noteReleasedUnobserved)
	}
	os.Remove(rr.file(lines))
}

// TestIntegrationKillAndReleaseRacingTheFinalWait: terminal/kill,
// terminal/output and terminal/release arrive while the command's releasing wait is in flight,
// after the receiver answered it (and so forgot the terminal) but before
// the custodian kept that answer: the order an agent that cancels a wait
// and kills at once can produce. The receiver answers them not_found;
// the custodian must answer them without error, as if they came after the
// wait (output: the final output the wait brought), with receipts that say
// what happened, and the exec's receipt must keep the exit. The hook holds
// the wait's answer until the kill and the output are sent.
func TestIntegrationKillAndReleaseRacingTheFinalWait(t *testing.T) {
	rr := startReceiver(t)
	held, release, outputSent := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once, outOnce sync.Once
	hook := func(_ context.Context, m, step string) {
		if m == acp.ClientMethodTerminalWaitForExit && step == "exit-observed" {
			once.Do(func() { close(held); <-release })
		}
		if m == acp.ClientMethodTerminalOutput && step == "before-dispatch-audit" {
			outOnce.Do(func() { close(outputSent) })
		}
	}
	s := newHookedSession(t, rr, hook)
	ctx := context.Background()
	term, err := s.agent.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: "sess-hooked", Command: "/bin/sh",
		Args: []string{"-c", "exit 3"}, Cwd: &rr.tuple.Root, Meta: s.meta("create")})
	must(t, err)
	waited := make(chan error, 1)
	go func() {
		_, err := s.agent.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId,
			Meta: s.meta("wait")})
		waited <- err
	}()
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the wait was never answered")
	}
	answered := make(chan error, 2)
	go func() {
		_, err := s.agent.KillTerminal(ctx, acp.KillTerminalRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId, Meta: s.meta("kill")})
		answered <- err
	}()
	type outAnswer struct {
		out acp.TerminalOutputResponse
		err error
	}
	output := make(chan outAnswer, 1)
	go func() {
		out, err := s.agent.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId,
			Meta: s.meta("output")})
		output <- outAnswer{out, err}
	}()
	waitReceiptNote(t, s, "kill")
	<-outputSent
	close(release)
	must(t, <-waited)
	must(t, <-answered)
	o := <-output
	must(t, o.err)
	if o.out.ExitStatus == nil || o.out.ExitStatus.ExitCode == nil || *o.out.ExitStatus.ExitCode != 3 {
		t.Fatalf("terminal/output racing the wait: %+v, want the final output with exit 3", o.out)
	}
	_, err = s.agent.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: "sess-hooked", TerminalId: term.TerminalId, Meta: s.meta("release")})
	must(t, err)
	if r := s.receipt(t, "kill"); r.Outcome != opstore.NeedsReview || r.Note != noteGoneAtWait {
		t.Fatalf("kill receipt %s, note %q, error %+v: want needs_review noting the wait had released it", r.Outcome, r.Note, r.Error)
	}
	if r := s.receipt(t, "create"); r.Outcome != opstore.Failed || r.Exit == nil || r.Exit.ExitCode == nil || *r.Exit.ExitCode != 3 {
		t.Fatalf("create receipt %s, exit %+v, note %q: want failed with exit 3", r.Outcome, r.Exit, r.Note)
	}
}

// waitReceiptNote waits until key's receipt exists and is pending: the
// request was dispatched (its intent is stored) and waits for its answer.
func waitReceiptNote(t *testing.T, s *hookedSession, key string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		raw, err := s.c.store.Get(opstore.Key(s.rr.tuple.SHA256(), "sess-hooked", s.run+"-"+key))
		if err == nil && raw != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was never dispatched", key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
