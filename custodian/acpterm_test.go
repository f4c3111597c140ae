package custodian

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/custodian/opstore"
)

// liveAgent is an in-process custodian bound to a real receiver process,
// with a minimal agent (testAgent, attaching like the plugin) whose
// connection a test drives callback by callback, with the params ACP
// agents really send.
type liveAgent struct {
	t     *testing.T
	rr    *realReceiver
	c     *Custodian
	dir   string
	agent *testAgent
	conn  *Conn
	seq   int
	plain bool
	mu    sync.Mutex
}

func newLiveAgent(t *testing.T) *liveAgent { return newLiveAgentWith(t, false, 0) }

// newLiveAgentWith binds a plain agent's session (plain: the agent never
// attaches nor tags) or a tether agent's, with a command budget (0: the
// default).
func newLiveAgentWith(t *testing.T, plain bool, budget time.Duration) *liveAgent {
	t.Helper()
	rr := startReceiver(t)
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	la := &liveAgent{t: t, rr: rr, dir: filepath.Join(t.TempDir(), "state"), plain: plain}
	la.c, err = New(Options{StateDir: la.dir, AuditKey: []byte(skey), CommandBudget: budget})
	must(t, err)
	recv := NewReceiver(rr.dialer(), Backoff{}, nil)
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	la.agent = &testAgent{sessionID: "sess-acp", attachOnNew: !plain}
	g := &testagent.Gate{R: c2aR, Ready: make(chan struct{})}
	la.agent.conn = acp.NewAgentSideConnection(la.agent, a2cW, g)
	close(g.Ready)
	la.conn = la.c.Serve(c2aW, a2cR, ConnOptions{})
	t.Cleanup(func() {
		c2aW.Close()
		a2cW.Close()
		la.conn.Close()
		recv.Close()
		if err := la.c.Close(); err != nil {
			t.Errorf("custodian Close: %v", err)
		}
	})
	ctx := context.Background()
	_, err = la.conn.Initialize(ctx)
	must(t, err)
	_, err = la.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: rr.tuple.Root, McpServers: []acp.McpServer{}},
		Binding{Tuple: rr.tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: "alice", Receiver: recv, Plain: plain})
	must(t, err)
	if la.agent.attachErr != nil {
		t.Fatal(la.agent.attachErr)
	}
	return la
}

// op returns a fresh op tag (none for a plain agent).
func (la *liveAgent) op() map[string]any {
	if la.plain {
		return nil
	}
	la.mu.Lock()
	la.seq++
	n := la.seq
	la.mu.Unlock()
	return acpmeta.Op{TupleSHA256: la.rr.tuple.SHA256(), OpKey: sprintf("acp-%d", n), Deadline: time.Now().Add(time.Minute)}.Meta()
}

func (la *liveAgent) sid() acp.SessionId { return acp.SessionId(la.agent.sessionID) }

func (la *liveAgent) create(req acp.CreateTerminalRequest) (string, error) {
	req.SessionId, req.Meta = la.sid(), la.op()
	resp, err := la.agent.conn.CreateTerminal(context.Background(), req)
	return resp.TerminalId, err
}

func (la *liveAgent) wait(id string) acp.WaitForTerminalExitResponse {
	la.t.Helper()
	w, err := la.agent.conn.WaitForTerminalExit(context.Background(), acp.WaitForTerminalExitRequest{SessionId: la.sid(), TerminalId: id, Meta: la.op()})
	must(la.t, err)
	return w
}

func (la *liveAgent) output(id string) (acp.TerminalOutputResponse, error) {
	return la.agent.conn.TerminalOutput(context.Background(), acp.TerminalOutputRequest{SessionId: la.sid(), TerminalId: id, Meta: la.op()})
}

func (la *liveAgent) release(id string) error {
	_, err := la.agent.conn.ReleaseTerminal(context.Background(), acp.ReleaseTerminalRequest{SessionId: la.sid(), TerminalId: id, Meta: la.op()})
	return err
}

func (la *liveAgent) kill(id string) error {
	_, err := la.agent.conn.KillTerminal(context.Background(), acp.KillTerminalRequest{SessionId: la.sid(), TerminalId: id, Meta: la.op()})
	return err
}

// audit returns the audit records so far.
func (la *liveAgent) audit() []audit.Record {
	la.t.Helper()
	_, err := la.c.Checkpoint()
	must(la.t, err)
	data, err := os.ReadFile(filepath.Join(la.dir, AuditDir, audit.LogFile))
	must(la.t, err)
	var out []audit.Record
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		r, err := audit.DecodeRecord([]byte(line))
		must(la.t, err)
		out = append(out, *r)
	}
	return out
}

// TestIntegrationTerminalShellLineAndBareNames sends what ACP agents send:
// a whole shell line in command with no args, no cwd and no env, and a
// bare command name with args and no PATH. Both run inside the computer as
// the grant's user, in the tuple's root; a relative path with a slash is
// refused (invalid).
func TestIntegrationTerminalShellLineAndBareNames(t *testing.T) {
	la := newLiveAgent(t)
	id, err := la.create(acp.CreateTerminalRequest{Command: "echo ran > ran.txt && id -u && pwd",
		Env: []acp.EnvVariable{{Name: "CLAUDECODE", Value: "1"}}, OutputByteLimit: new(32000)})
	must(t, err)
	if w := la.wait(id); w.ExitCode == nil || *w.ExitCode != 0 {
		t.Fatalf("shell line exit %+v", w)
	}
	out, err := la.output(id)
	must(t, err)
	if want := sprintf("%d\n%s\n", grantUID, la.rr.tuple.Root); out.Output != want {
		t.Fatalf("shell line output %q, want %q (the grant's uid, in the root)", out.Output, want)
	}
	fi, err := os.Stat(la.rr.file("ran.txt"))
	must(t, err)
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != grantUID {
		t.Fatalf("ran.txt owned by %d, want the grant's %d", st.Uid, grantUID)
	}
	id, err = la.create(acp.CreateTerminalRequest{Command: "id", Args: []string{"-u"}})
	must(t, err)
	la.wait(id)
	if out, _ := la.output(id); out.Output != sprintf("%d\n", grantUID) {
		t.Fatalf("bare name with no PATH: output %q", out.Output)
	}
	_, err = la.create(acp.CreateTerminalRequest{Command: "bin/id", Args: []string{"-u"}})
	wantCode(t, err, errcode.CodeInvalid)
}

// TestIntegrationTerminalOutputPolledWhileRunning: terminal/output on a
// running command answers the output so far and no exit status; after the
// exit the whole output and the status. outputByteLimit 0 keeps nothing.
func TestIntegrationTerminalOutputPolledWhileRunning(t *testing.T) {
	la := newLiveAgent(t)
	gate := la.rr.file("gate")
	must(t, syscall.Mkfifo(gate, 0o600))
	must(t, os.Chown(gate, int(grantUID), int(grantGID)))
	id, err := la.create(acp.CreateTerminalRequest{Command: "printf first; read x < gate; printf ' done'"})
	must(t, err)
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow machine, not a wait
	for {
		out, err := la.output(id)
		must(t, err)
		if out.ExitStatus != nil {
			t.Fatalf("the command cannot have exited before the gate opened: %+v", out)
		}
		if out.Output == "first" {
			break
		}
		if out.Output != "" || time.Now().After(deadline) {
			t.Fatalf("polled output %q", out.Output)
		}
		time.Sleep(5 * time.Millisecond)
	}
	w, err := os.OpenFile(gate, os.O_WRONLY, 0)
	must(t, err)
	w.WriteString("go\n")
	w.Close()
	la.wait(id)
	out, err := la.output(id)
	must(t, err)
	if out.Output != "first done" || out.ExitStatus == nil || out.ExitStatus.ExitCode == nil || *out.ExitStatus.ExitCode != 0 {
		t.Fatalf("after exit: %+v", out)
	}
	id, err = la.create(acp.CreateTerminalRequest{Command: "echo hello", OutputByteLimit: new(0)})
	must(t, err)
	la.wait(id)
	if out, _ := la.output(id); out.Output != "" || !out.Truncated {
		t.Fatalf("outputByteLimit 0: %+v, want nothing kept and truncated", out)
	}
}

// TestIntegrationTerminalRepeatedKillAndRelease: a kill after an exit that
// terminal/output showed is forwarded and answered; a second release, and
// a kill after release, are answered without error and send nothing; each
// is recorded (a receipt with its note, an audit result coded not_sent).
// Output of a released terminal is not_found. After wait_for_exit (whose
// exec_wait released the terminal on the receiver and carried its final
// output), output is answered from that answer, and kill and release send
// nothing, noted as such. Two releases racing send one exec_release.
func TestIntegrationTerminalRepeatedKillAndRelease(t *testing.T) {
	la := newLiveAgent(t)
	id, err := la.create(acp.CreateTerminalRequest{Command: "true"})
	must(t, err)
	waitExitByOutput(t, la, id)
	must(t, la.kill(id)) // after exit: forwarded, the receiver acknowledges
	must(t, la.release(id))
	must(t, la.release(id))
	must(t, la.kill(id))
	_, err = la.output(id)
	wantCode(t, err, errcode.CodeNotFound)
	recs := la.audit()
	if n := countRecords(recs, audit.KindResult, codeNotSent); n != 2 {
		t.Fatalf("%d audit results coded %s, want 2 (the second release, the kill after it)", n, codeNotSent)
	}
	if n := countDispatches(recs, acp.ClientMethodTerminalKill); n != 1 {
		t.Fatalf("%d kills sent, want 1 (the one after exit)", n)
	}
	if n := countReceiptNotes(t, la, id, noteAlreadyReleased); n != 2 {
		t.Fatalf("%d receipts say the terminal was already released, want 2", n)
	}

	id, err = la.create(acp.CreateTerminalRequest{Command: "printf done"})
	must(t, err)
	la.wait(id)
	before := la.audit()
	out, err := la.output(id)
	must(t, err)
	if out.Output != "done" || out.ExitStatus == nil || *out.ExitStatus.ExitCode != 0 {
		t.Fatalf("output after wait: %+v", out)
	}
	must(t, la.kill(id))
	must(t, la.release(id))
	after := la.audit()
	for _, m := range []string{acp.ClientMethodTerminalOutput, acp.ClientMethodTerminalKill, acp.ClientMethodTerminalRelease} {
		if n := countDispatches(after, m) - countDispatches(before, m); n != 0 {
			t.Fatalf("%d %s sent after a releasing wait, want 0", n, m)
		}
	}
	if n := countRecords(after, audit.KindResult, codeNotSent) - countRecords(before, audit.KindResult, codeNotSent); n != 3 {
		t.Fatalf("%d audit results coded %s after the wait, want 3 (output, kill, release)", n, codeNotSent)
	}
	if n := countReceiptNotes(t, la, id, noteReleasedAtWait); n != 2 {
		t.Fatalf("%d receipts say the wait released the terminal, want 2 (kill, release)", n)
	}

	id, err = la.create(acp.CreateTerminalRequest{Command: "sleep 100"})
	must(t, err)
	nrel := countDispatches(la.audit(), acp.ClientMethodTerminalRelease)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			if i == 2 {
				errs[i] = la.kill(id)
			} else {
				errs[i] = la.release(id)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("racing call %d: %v", i, err)
		}
	}
	if n := countDispatches(la.audit(), acp.ClientMethodTerminalRelease) - nrel; n != 1 {
		t.Fatalf("%d releases sent for two racing releases, want 1", n)
	}
}

// waitExitByOutput polls terminal/output until it shows the exit.
func waitExitByOutput(t *testing.T, la *liveAgent, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow machine, not a wait
	for {
		out, err := la.output(id)
		must(t, err)
		if out.ExitStatus != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exit shown by terminal/output")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countReceiptNotes counts the NeedsReview receipts of terminal id with
// note and an empty answer.
func countReceiptNotes(t *testing.T, la *liveAgent, id, note string) int {
	rs, err := la.c.store.List()
	must(t, err)
	n := 0
	for _, r := range rs {
		if r.Note == note && r.Outcome == opstore.NeedsReview && r.TerminalID == id && string(r.Response) == "{}" {
			n++
		}
	}
	return n
}

func countRecords(recs []audit.Record, kind audit.Kind, code string) int {
	n := 0
	for _, r := range recs {
		if r.Kind == kind && r.Code == code {
			n++
		}
	}
	return n
}

func countDispatches(recs []audit.Record, method string) int {
	n := 0
	for _, r := range recs {
		if r.Kind == audit.KindDispatch && r.Method == method {
			n++
		}
	}
	return n
}

// TestIntegrationPlainWaitSeesTheDeadlineKill: a plain agent's create and
// wait both get the command budget as their deadline; the wait still
// answers the exit of the command its deadline killed (signal KILL), not
// fate_unknown at the same instant.
func TestIntegrationPlainWaitSeesTheDeadlineKill(t *testing.T) {
	la := newLiveAgentWith(t, true, 2*time.Second)
	id, err := la.create(acp.CreateTerminalRequest{Command: "sleep 100"})
	must(t, err)
	w := la.wait(id)
	if w.ExitCode != nil || w.Signal == nil || *w.Signal != "KILL" {
		t.Fatalf("wait = %+v, want the deadline's KILL", w)
	}
	must(t, la.release(id))
}
