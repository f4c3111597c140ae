package custodian

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/fixtures/etcdtest"
	"github.com/tetherdev/tether/receiver/wire"
)

// runAnswers drives create, wait_for_exit, output and release of argv
// with op keys KEY:step, as the plugin does, through conn, and returns
// each answer's JSON (or the error's) in that order.
func runAnswers(t *testing.T, conn *acp.AgentSideConnection, sid acp.SessionId, meta func(string) map[string]any, key string, req acp.CreateTerminalRequest) []string {
	t.Helper()
	ctx := context.Background()
	answer := func(v any, err error) string {
		if err != nil {
			b, _ := json.Marshal(err)
			return "error " + string(b)
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	req.SessionId, req.Meta = sid, meta(key+":create")
	c, err := conn.CreateTerminal(ctx, req)
	out := []string{answer(c, err)}
	if err != nil {
		return out
	}
	w, err := conn.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid, TerminalId: c.TerminalId, Meta: meta(key + ":wait")})
	out = append(out, answer(w, err))
	o, err := conn.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: sid, TerminalId: c.TerminalId, Meta: meta(key + ":output")})
	out = append(out, answer(o, err))
	r, err := conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid, TerminalId: c.TerminalId, Meta: meta(key + ":release")})
	return append(out, answer(r, err))
}

// sameAnswers fails unless a retry's answers equal the first call's, byte
// for byte.
func sameAnswers(t *testing.T, first, retry []string) {
	t.Helper()
	if strings.Join(first, "\n") != strings.Join(retry, "\n") {
		t.Fatalf("retry answered\n%s\nwant the first answers\n%s", strings.Join(retry, "\n"), strings.Join(first, "\n"))
	}
}

// TestExecRetryAfterReleaseAnswersFromReceipt: a retry of a released
// command's whole sequence with the same op key and arguments gets the
// first answers byte for byte (terminal id, exit, output, truncation)
// from the receipt, and nothing reaches the receiver.
func TestExecRetryAfterReleaseAnswersFromReceipt(t *testing.T) {
	h := newHarness(t)
	code := 3
	h.fr.on(wire.OpExecStart, func(context.Context, *wire.Request, any) (any, error) {
		return wire.ExecStartResult{TerminalID: "t-replay", PID: 7}, nil
	})
	h.fr.on(wire.OpExecWait, func(context.Context, *wire.Request, any) (any, error) {
		out := "...tail of out-1\n"
		return wire.ExecWaitResult{Exit: wire.ExitStatus{ExitCode: &code}, Output: &out, Truncated: true, Released: true}, nil
	})
	h.bind()
	req := acp.CreateTerminalRequest{Command: "/bin/sh", Args: []string{"-c", "echo x >> side.txt; echo out-1"}}
	first := runAnswers(t, h.agent.conn, sid(h), h.op, "k1", req)
	sent := len(h.fr.ops())
	retry := runAnswers(t, h.agent.conn, sid(h), h.op, "k1", req)
	sameAnswers(t, first, retry)
	if !strings.Contains(first[2], `"truncated":true`) || !strings.Contains(first[1], `"exitCode":3`) {
		t.Fatalf("first answers %v: want exit 3 and truncated output", first)
	}
	if n := len(h.fr.ops()); n != sent {
		t.Fatalf("the retry sent %d requests to the receiver, want 0: %v", n-sent, h.fr.ops()[sent:])
	}
	raw, err := h.c.store.Get(h.key("k1:create"))
	must(t, err)
	r, err := opstore.Unmarshal(raw)
	must(t, err)
	if r.Output == nil || r.Output.Output != "...tail of out-1\n" || !r.Output.Truncated || r.Outcome != opstore.Failed {
		t.Fatalf("receipt %s: want failed (exit 3) keeping the truncated output", raw)
	}
	req.Args = []string{"-c", "echo other"}
	_, err = h.agent.conn.CreateTerminal(context.Background(), acp.CreateTerminalRequest{SessionId: sid(h),
		Command: req.Command, Args: req.Args, Meta: h.op("k1:create")})
	wantCode(t, err, errcode.CodeOpKeyConflict)
}

// TestExecRetryOfInterruptedAnswersInterrupted: a command whose exit was
// never observed (the custodian stopped: its receipt is interrupted, its
// response the terminal id) is answered interrupted on a retry, with the
// receipt in the error's data, and nothing is run or waited for.
func TestExecRetryOfInterruptedAnswersInterrupted(t *testing.T) {
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	h := newHarness(t, func(o *Options) { o.AuditKey = []byte(skey) })
	h.scriptExec(0, nil)
	h.bind()
	ctx := context.Background()
	req := acp.CreateTerminalRequest{SessionId: sid(h), Command: "/bin/sleep", Args: []string{"60"}, Meta: h.op("k2:create")}
	if _, err := h.agent.conn.CreateTerminal(ctx, req); err != nil {
		t.Fatal(err)
	}
	h.close()
	h2 := newHarness(t, func(o *Options) { o.StateDir, o.AuditKey = h.dir, []byte(skey) })
	h2.scriptExec(0, nil)
	h2.bind()
	sent := len(h2.fr.ops())
	req.SessionId, req.Meta = sid(h2), h2.op("k2:create")
	_, err = h2.agent.conn.CreateTerminal(ctx, req)
	wantCode(t, err, errcode.CodeInterrupted)
	var re *acp.RequestError
	if !errors.As(err, &re) {
		t.Fatalf("%v is not an ACP error", err)
	}
	data, _ := json.Marshal(re.Data)
	if !strings.Contains(string(data), `"receipt":{`) || !strings.Contains(string(data), `"outcome":"interrupted"`) {
		t.Fatalf("error data %s: want the interrupted receipt", data)
	}
	if n := len(h2.fr.ops()); n != sent {
		t.Fatalf("the retry sent %v", h2.fr.ops()[sent:])
	}
}

// keyedMeta returns the op tag of key for la's tuple.
func (la *liveAgent) keyedMeta(key string) map[string]any {
	return acpmeta.Op{TupleSHA256: la.rr.tuple.SHA256(), OpKey: key, Deadline: time.Now().Add(time.Minute)}.Meta()
}

// TestIntegrationRetryAnswersFromReceipt runs, through a real receiver,
// the command (appending a line to side.txt, printing out-1), a
// write, a read and an edit (its read, then its write with the read's
// digest as precondition), each with an op key; then retries each with
// the same keys and arguments after the command's terminal was released
// and the files were changed behind the custodian's back. Every retry's
// answers equal the first's byte for byte, side.txt has one line, and
// the changed files keep the change: nothing ran twice.
func TestIntegrationRetryAnswersFromReceipt(t *testing.T) {
	la := newLiveAgent(t)
	ctx := context.Background()
	cmd := acp.CreateTerminalRequest{Command: "/bin/sh", Args: []string{"-c", "echo x >> side.txt; echo out-1"}}
	first := runAnswers(t, la.agent.conn, la.sid(), la.keyedMeta, "k1", cmd)
	if !strings.Contains(first[2], `"output":"out-1\n"`) || !strings.Contains(first[1], `"exitCode":0`) {
		t.Fatalf("first run: %v", first)
	}
	retry := runAnswers(t, la.agent.conn, la.sid(), la.keyedMeta, "k1", cmd)
	sameAnswers(t, first, retry)
	if got := sideLines(t, la.rr, "side.txt"); len(got) != 1 {
		t.Fatalf("side.txt has %d lines %v, want 1: the retry ran the command again", len(got), got)
	}

	path := func(rel string) string { return la.rr.tuple.Root + "/" + rel }
	answer := func(v any, err error) string {
		if err != nil {
			b, _ := json.Marshal(err)
			return "error " + string(b)
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	write := func(key, rel, content string, meta map[string]any) string {
		return answer(la.agent.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: la.sid(), Path: path(rel), Content: content,
			Meta: acpmeta.MergeMeta(la.keyedMeta(key), meta)}))
	}
	read := func(key, rel string) (acp.ReadTextFileResponse, string) {
		r, err := la.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: la.sid(), Path: path(rel), Meta: la.keyedMeta(key)})
		return r, answer(r, err)
	}
	behind := func(rel, content string) { must(t, os.WriteFile(la.rr.file(rel), []byte(content), 0o644)) }
	fileIs := func(rel, want string) {
		t.Helper()
		if b, err := os.ReadFile(la.rr.file(rel)); err != nil || string(b) != want {
			t.Fatalf("%s holds %q (%v), want %q", rel, b, err, want)
		}
	}

	w1 := write("w1:write", "w.txt", "written once\n", nil)
	behind("w.txt", "changed behind\n")
	if w2 := write("w1:write", "w.txt", "written once\n", nil); w2 != w1 {
		t.Fatalf("write retry answered %s, want %s", w2, w1)
	}
	fileIs("w.txt", "changed behind\n")

	behind("r.txt", "first content\n")
	_, r1 := read("r1:read", "r.txt")
	behind("r.txt", "second content\n")
	if _, r2 := read("r1:read", "r.txt"); r2 != r1 || !strings.Contains(r1, "first content") {
		t.Fatalf("read retry answered %s, want %s", r2, r1)
	}

	behind("e.txt", "alpha\nbeta\n")
	edit := func() []string {
		r, a := read("e1:read", "e.txt")
		updated := strings.Replace(r.Content, "beta", "gamma", 1)
		return []string{a, write("e1:write", "e.txt", updated, acpmeta.Expect{SHA256: sha256Hex([]byte(r.Content))}.Meta())}
	}
	e1 := edit()
	fileIs("e.txt", "alpha\ngamma\n")
	behind("e.txt", "edited behind\n")
	sameAnswers(t, e1, edit())
	fileIs("e.txt", "edited behind\n")
}

// TestExecRetryOutputTooLargeToKeep: a final output that would pass the
// receipt's bound is not kept (the note says so); a retry's wait still
// answers the exit from the receipt, its output is refused too_large,
// and nothing reaches the receiver.
func TestExecRetryOutputTooLargeToKeep(t *testing.T) {
	h := newHarness(t)
	code := 0
	big := strings.Repeat("a", 1_044_000) // fits one frame, not a receipt with its fields
	h.fr.on(wire.OpExecStart, func(context.Context, *wire.Request, any) (any, error) {
		return wire.ExecStartResult{TerminalID: "t-big", PID: 7}, nil
	})
	h.fr.on(wire.OpExecWait, func(context.Context, *wire.Request, any) (any, error) {
		return wire.ExecWaitResult{Exit: wire.ExitStatus{ExitCode: &code}, Output: &big, Released: true}, nil
	})
	h.bind()
	req := acp.CreateTerminalRequest{Command: "/bin/sh", Args: []string{"-c", "yes a | head -c 1044000"}}
	first := runAnswers(t, h.agent.conn, sid(h), h.op, "k3", req)
	if !strings.Contains(first[2], big) {
		t.Fatal("the first run's output did not answer the whole output")
	}
	sent := len(h.fr.ops())
	retry := runAnswers(t, h.agent.conn, sid(h), h.op, "k3", req)
	if retry[0] != first[0] || retry[1] != first[1] || retry[3] != first[3] || !strings.Contains(retry[2], `"tether":"too_large"`) {
		t.Fatalf("retry answered %.300v; want create, wait and release as first, output too_large", retry)
	}
	if n := len(h.fr.ops()); n != sent {
		t.Fatalf("the retry sent %v", h.fr.ops()[sent:])
	}
	raw, err := h.c.store.Get(h.key("k3:create"))
	must(t, err)
	r, err := opstore.Unmarshal(raw)
	must(t, err)
	if r.Output != nil || !strings.Contains(r.Note, "not kept for replay") || r.Exit == nil || r.Outcome != opstore.NeedsReview {
		t.Fatalf("receipt %.400s: want needs_review with its exit, no output, a note", raw)
	}
}

// TestIntegrationFleetRetryAfterTakeover: custodian A answers a write, a
// read and a command run in full, starts a second command that runs on,
// and is SIGKILLed; B takes the session over from etcd. At B, the
// retries of the write, the read (the file changed meanwhile) and the
// finished command answer what A answered, byte for byte; the command
// that was running answers interrupted, as its receipt says; nothing
// runs twice.
func TestIntegrationFleetRetryAfterTakeover(t *testing.T) {
	rr := startReceiver(t)
	c := etcdtest.Start(t, etcdtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fc := newFleetConfig(t, c, rr, rr.tuple, "sess-replay")
	a := startFleet(t, fc, "custodian-a")
	a.bound(t)
	sid := acp.SessionId(fc.Session)
	path := rr.tuple.Root + "/f.txt"
	fileOps := func(p *fleetProc) string {
		w, werr := p.agent.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: sid, Path: path, Content: "from a\n", Meta: p.meta("w1:write")})
		r, rerr := p.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid, Path: path, Meta: p.meta("r1:read")})
		return mustJSON([]any{w, werr, r, rerr})
	}
	atA := fileOps(a)
	if !strings.Contains(atA, `"content":"from a\n"`) || strings.Count(atA, "null") != 2 {
		t.Fatalf("write and read at A: %s", atA)
	}
	ranA, err := a.execAnswers(ctx, "q1", "echo q1 >> side; echo out-q1")
	must(t, err)
	if _, err := a.create(ctx, "q2", "echo q2 >> side; exec sleep 60"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(sideLines(t, rr, "side")) == 2 })
	a.kill()
	must(t, os.WriteFile(rr.file("f.txt"), []byte("changed behind\n"), 0o644))

	fb := fc
	fb.Standby = true
	b := startFleet(t, fb, "custodian-b")
	b.bound(t)
	if atB := fileOps(b); atB != atA {
		t.Fatalf("write and read retried at B answered\n%s\nat A\n%s", atB, atA)
	}
	ranB, err := b.execAnswers(ctx, "q1", "echo q1 >> side; echo out-q1")
	must(t, err)
	if strings.Join(ranB, "\n") != strings.Join(ranA, "\n") || !strings.Contains(ranA[2], `"output":"out-q1\n"`) {
		t.Fatalf("q1 retried at B answered\n%s\nat A\n%s", strings.Join(ranB, "\n"), strings.Join(ranA, "\n"))
	}
	_, err = b.create(ctx, "q2", "echo q2 >> side; exec sleep 60")
	wantCode(t, err, errcode.CodeInterrupted)
	checkReceipt(t, c, fc, "q2:create", opstore.Interrupted)
	if got := strings.Join(sideLines(t, rr, "side"), ","); got != "q1,q2" {
		t.Fatalf("side effects %s, want q1,q2: a retry ran again", got)
	}
	if b, _ := os.ReadFile(rr.file("f.txt")); string(b) != "changed behind\n" {
		t.Fatalf("f.txt = %q: the write ran again at B", b)
	}
}

// TestPlainAgentReceiptsKeepNoContent: a plain agent's keys are minted by
// the custodian for one request, so no retry can name them: its read
// leaves no receipt and its command's receipt keeps no output (only what
// a tether agent's retry needs is kept).
func TestPlainAgentReceiptsKeepNoContent(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.CommandBudget = 2 * time.Minute })
	h.connectAgent(false)
	h.scriptFiles()
	code := 0
	h.fr.on(wire.OpExecStart, func(context.Context, *wire.Request, any) (any, error) {
		return wire.ExecStartResult{TerminalID: "t-plain", PID: 7}, nil
	})
	h.fr.on(wire.OpExecWait, func(context.Context, *wire.Request, any) (any, error) {
		out := "SECRET-OUTPUT\n"
		return wire.ExecWaitResult{Exit: wire.ExitStatus{ExitCode: &code}, Output: &out, Released: true}, nil
	})
	h.bindPlain()
	ctx := context.Background()
	if _, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a"}); err != nil {
		t.Fatal(err)
	}
	answers := runAnswers(t, h.agent.conn, sid(h), func(string) map[string]any { return nil }, "", acp.CreateTerminalRequest{Command: "cat secret"})
	if !strings.Contains(answers[2], "SECRET-OUTPUT") {
		t.Fatalf("answers %v", answers)
	}
	rs, err := h.c.store.List()
	must(t, err)
	for _, r := range rs {
		if r.Method == acp.ClientMethodFsReadTextFile || r.Output != nil || strings.Contains(string(r.Response), "hello from") {
			t.Fatalf("a plain agent's receipt keeps content: %+v", r)
		}
	}
	if len(rs) == 0 {
		t.Fatal("no receipt for the plain agent's command")
	}
}
