package custodian

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/binding"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// auditLog reads every record of h's audit log, after a checkpoint (which
// writes the refusals counted so far).
func auditLog(t *testing.T, h *harness) []*audit.Record {
	t.Helper()
	if _, err := h.c.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(h.dir, AuditDir, audit.LogFile))
	if err != nil {
		t.Fatal(err)
	}
	var out []*audit.Record
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, audit.MaxRecordBytes+1)
	for sc.Scan() {
		r, err := audit.DecodeRecord(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func auditSize(t *testing.T, h *harness) int64 {
	t.Helper()
	if _, err := h.c.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(h.dir, AuditDir, audit.LogFile))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// refusalCounts sums the counts of every refusals record per code.
func refusalCounts(rs []*audit.Record) (map[string]int64, int) {
	out, records := map[string]int64{}, 0
	for _, r := range rs {
		if r.Kind == audit.KindRefusals {
			records++
			for code, n := range r.Refusals {
				out[code] += n.Count
			}
		}
	}
	return out, records
}

// TestAttackRefusalFloodIsAggregatedAndFenced: an agent that floods
// refused callbacks grows the audit log by a bounded amount, every refusal
// is still counted in the signed log, and its session is fenced for good
// once it passes the refusal budget, with the fence recorded.
func TestAttackRefusalFloodIsAggregatedAndFenced(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RefusalBudget = 100 })
	h.scriptFiles()
	h.bind()
	before := auditSize(t, h)
	ctx := context.Background()
	const flood = 4000
	for i := range flood {
		path := "/etc/passwd" // path_escape
		if i%2 == 1 {
			path = h.tuple.Root + "/../x" // path_escape too, another shape
		}
		if _, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: path,
			Meta: h.op("flood-" + itoa(i))}); err == nil {
			t.Fatal("an escaping read was served")
		}
	}
	if grown := auditSize(t, h) - before; grown > 32<<10 {
		t.Fatalf("%d refusals grew the audit log by %d bytes, want at most 32 KiB", flood, grown)
	}
	_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/ok", Meta: h.op("after")})
	wantCode(t, err, errcode.CodeFenced)
	wantCode(t, h.attach(), errcode.CodeFenced) // the budget's fence is not lifted by an attach
	rs := auditLog(t, h)
	counts, _ := refusalCounts(rs)
	if counts["path_escape"]+counts["fenced"] != flood+2 || counts["path_escape"] != 101 {
		t.Fatalf("refusals counted %v, want %d in all, 101 path_escape before the fence", counts, flood+2)
	}
	fences := 0
	for i, r := range rs {
		if r.Kind == audit.KindFence && r.Code == string(binding.CodeRefusalBudget) {
			fences++
			if i == 0 || rs[i-1].Kind != audit.KindRefusals {
				t.Fatalf("the fence record does not follow the refusals that caused it: %+v", rs[max(i-1, 0)])
			}
		}
	}
	if fences != 1 {
		t.Fatalf("%d refusal_budget fence records, want 1", fences)
	}
	_, verifier, err := audit.LoadSigner(h.c.opts.AuditKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := audit.Verify(filepath.Join(h.dir, AuditDir), verifier, nil); err != nil {
		t.Fatalf("audit verify: %v", err)
	}
	if h.fr.count(wire.OpRead) != 0 {
		t.Fatal("a refused read reached the receiver")
	}
}

// TestRefusalRecordsAtBoundedRate: refusals spread over time give at most
// one record per RefusalRecordEvery, each with the first and last of its
// codes, and those of sessions not bound are counted for the connection.
func TestRefusalRecordsAtBoundedRate(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RefusalRecordEvery = 200 * time.Millisecond })
	h.scriptFiles()
	h.bind()
	ctx := context.Background()
	start := time.Now()
	for i := 0; time.Since(start) < time.Second; i++ {
		h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: "/etc/passwd", Meta: h.op("r-" + itoa(i))})
		h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: "nobody", Path: "/x", Meta: h.op("u-" + itoa(i))})
	}
	elapsed := time.Since(start)
	rs := auditLog(t, h)
	perSession := map[string]int{}
	for _, r := range rs {
		if r.Kind != audit.KindRefusals {
			continue
		}
		perSession[r.SessionID]++
		for code, n := range r.Refusals {
			if n.Count < 1 || n.First.Time.After(n.Last.Time) || n.First.Method != acp.ClientMethodFsReadTextFile {
				t.Fatalf("%s: %+v", code, n)
			}
		}
	}
	limit := int(elapsed/(200*time.Millisecond)) + 2 // the periodic ones, and the checkpoint's
	if perSession[h.agent.sessionID] == 0 || perSession[h.agent.sessionID] > limit || perSession[""] == 0 || perSession[""] > limit {
		t.Fatalf("refusals records per session %v over %s, want 1..%d each", perSession, elapsed, limit)
	}
}

// TestReattachClaimsTerminals: after a lost receiver link, the attach that
// lifts the fence also asks the receiver for each of the session's
// unreleased terminals, so the receiver hands them to the new connection
// before its orphan grace ends.
func TestReattachClaimsTerminals(t *testing.T) {
	h := newHarness(t)
	h.scriptExec(0, nil)
	h.bind()
	ctx := context.Background()
	if _, err := h.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid(h), Command: "sleep",
		Args: []string{"600"}, Meta: h.op("c1")}); err != nil {
		t.Fatal(err)
	}
	outputs := h.fr.count(wire.OpExecOutput)
	h.dropReceiver()
	deadline := time.Now().Add(10 * time.Second)
	for h.attach() != nil {
		if time.Now().After(deadline) {
			t.Fatal("no reattach within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := h.fr.count(wire.OpExecOutput) - outputs; got != 1 {
		t.Fatalf("the reattach asked for %d terminals, want the session's one", got)
	}
	if r := h.fr.last(); r.Op != wire.OpExecOutput || r.TupleSHA256 != h.tuple.SHA256() {
		t.Fatalf("last request %+v", r)
	}
}

// TestCloseSessionReleasesTerminals (fake receiver): ending a session
// releases its unreleased terminals and forgets its binding.
func TestCloseSessionReleasesTerminals(t *testing.T) {
	h := newHarness(t)
	h.scriptExec(0, nil)
	var n atomic.Int32
	h.fr.on(wire.OpExecStart, func(context.Context, *wire.Request, any) (any, error) {
		return wire.ExecStartResult{TerminalID: "t" + itoa(int(n.Add(1))), PID: 4242}, nil
	})
	h.bind()
	ctx := context.Background()
	for _, key := range []string{"a", "b"} {
		if _, err := h.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid(h), Command: "sleep",
			Args: []string{"600"}, Meta: h.op(key)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.conn.CloseSession(ctx, h.agent.sessionID); err != nil {
		t.Fatal(err)
	}
	if n := h.fr.count(wire.OpExecRelease); n != 2 {
		t.Fatalf("%d releases at session end, want 2", n)
	}
	_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/x", Meta: h.op("late")})
	wantCode(t, err, errcode.CodeNotAdmitted)
}

func itoa(i int) string { return strconv.Itoa(i) }

// CloseSession answers session/close (the test agent keeps no state).
func (a *testAgent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, nil
}

// realSession binds the harness's test agent, through an in-process
// custodian, to a real receiver process.
type realSession struct {
	rr    *realReceiver
	c     *Custodian
	conn  *Conn
	agent *testAgent
	// agentOut is the agent's output stream: closing it is the agent
	// exiting, as the custodian sees it.
	agentOut io.Closer
}

func newRealSession(t *testing.T) *realSession {
	t.Helper()
	rr := startReceiver(t)
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	c, err := New(Options{StateDir: filepath.Join(t.TempDir(), "state"), AuditKey: []byte(skey)})
	must(t, err)
	recv := NewReceiver(rr.dialer(), Backoff{}, nil)
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	s := &realSession{rr: rr, c: c, agent: &testAgent{sessionID: "sess-real", attachOnNew: true}, agentOut: a2cW}
	g := &testagent.Gate{R: c2aR, Ready: make(chan struct{})}
	s.agent.conn = acp.NewAgentSideConnection(s.agent, a2cW, g)
	close(g.Ready)
	s.conn = c.Serve(c2aW, a2cR, ConnOptions{})
	t.Cleanup(func() {
		c2aW.Close()
		a2cW.Close()
		s.conn.Close()
		recv.Close()
		must(t, c.Close())
	})
	ctx := context.Background()
	_, err = s.conn.Initialize(ctx)
	must(t, err)
	_, err = s.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: rr.tuple.Root, McpServers: []acp.McpServer{}},
		Binding{Tuple: rr.tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: "alice", Receiver: recv})
	must(t, err)
	return s
}

func (s *realSession) op(key string) map[string]any {
	return acpmeta.Op{TupleSHA256: s.rr.tuple.SHA256(), OpKey: key, Deadline: time.Now().Add(time.Minute)}.Meta()
}

// sleeper starts `sleep 600` in the computer and returns its pid, which
// the command writes into the root first.
func (s *realSession) sleeper(t *testing.T, key string) int {
	t.Helper()
	_, err := s.agent.conn.CreateTerminal(context.Background(), acp.CreateTerminalRequest{SessionId: "sess-real",
		Command: "echo $$ > " + key + ".pid && exec /bin/sleep 600", Meta: s.op(key)})
	must(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, err := os.ReadFile(s.rr.file(key + ".pid"))
		if pid, perr := strconv.Atoi(string(bytes.TrimSpace(data))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleeper %s wrote no pid: %v", key, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitDead waits, within bound, until none of pids is a live process of
// the grant's uid.
func waitDead(t *testing.T, bound time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		var live []int
		for _, pid := range pids {
			if liveOfGrant(pid) {
				live = append(live, pid)
			}
		}
		if len(live) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("commands %v still run %s after their session ended", live, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveOfGrant reports whether pid is a process of the grant's uid and
// not a zombie.
func liveOfGrant(pid int) bool {
	status, err := os.ReadFile("/proc/" + itoa(pid) + "/status")
	return err == nil && bytes.Contains(status, []byte("\nUid:\t"+itoa(int(grantUID))+"\t")) &&
		!bytes.Contains(status, []byte("State:\tZ"))
}

// TestIntegrationConnEndReleasesTerminals: when the agent's ACP connection
// ends (the agent exits), the custodian releases the commands its session
// left running, instead of leaving them until their deadline (600 s here)
// while its own link to the receiver stays up.
func TestIntegrationConnEndReleasesTerminals(t *testing.T) {
	s := newRealSession(t)
	pids := []int{s.sleeper(t, "s1"), s.sleeper(t, "s2")}
	s.agentOut.Close() // the agent exits
	waitDead(t, 15*time.Second, pids...)
}

// TestIntegrationCloseSessionReleasesTerminals: CloseSession releases the
// session's commands on the real receiver and completes their receipts.
func TestIntegrationCloseSessionReleasesTerminals(t *testing.T) {
	s := newRealSession(t)
	pid := s.sleeper(t, "s1")
	must(t, s.conn.CloseSession(context.Background(), "sess-real"))
	waitDead(t, 15*time.Second, pid)
	raw, err := s.c.store.Get(opstore.Key(s.rr.tuple.SHA256(), "sess-real", "s1"))
	must(t, err)
	r, err := opstore.Unmarshal(raw)
	must(t, err)
	if r.Outcome != opstore.Failed || r.Note != noteReleasedUnobserved {
		t.Fatalf("receipt after the session's end: %s %q", r.Outcome, r.Note)
	}
}

// TestIntegrationTrailingSlashWritesNoFile: fs/write_text_file to a path
// ending in a slash names a directory; it must not create a regular file
// at the name before the slash.
func TestIntegrationTrailingSlashWritesNoFile(t *testing.T) {
	s := newRealSession(t)
	must(t, os.Mkdir(s.rr.file("dir"), 0o755))
	must(t, os.Chown(s.rr.file("dir"), int(grantUID), int(grantGID)))
	for i, p := range []string{"name/", "dir/name/", "dir/other/.", "dir/x//"} {
		_, err := s.agent.conn.WriteTextFile(context.Background(), acp.WriteTextFileRequest{SessionId: "sess-real",
			Path: s.rr.tuple.Root + "/" + p, Content: "x", Meta: s.op("slash-" + itoa(i))})
		wantCode(t, err, errcode.CodeInvalid)
		name := strings.TrimRight(strings.TrimSuffix(p, "/."), "/")
		if _, err := os.Lstat(s.rr.file(name)); err == nil {
			t.Fatalf("a write to %q created %s", p, name)
		}
	}
}

// key is the store key of op key k in the harness's session.
func (h *harness) key(k string) string { return opstore.Key(h.tuple.SHA256(), h.agent.sessionID, k) }

// otherSession binds a second agent connection on h's custodian and
// receiver, as session id with tuple tu, and returns its agent.
func (h *harness) otherSession(id string, tu admission.Tuple) *testAgent {
	h.t.Helper()
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	a := &testAgent{sessionID: id, attachOnNew: true}
	g := &testagent.Gate{R: c2aR, Ready: make(chan struct{})}
	a.conn = acp.NewAgentSideConnection(a, a2cW, g)
	close(g.Ready)
	conn := h.c.Serve(c2aW, a2cR, ConnOptions{})
	h.t.Cleanup(func() { c2aW.Close(); a2cW.Close(); conn.Close() })
	ctx := context.Background()
	if _, err := conn.Initialize(ctx); err != nil {
		h.t.Fatal(err)
	}
	b := Binding{Tuple: tu, LeaseNotAfter: h.lease, Principal: tu.Owner, Receiver: h.recv}
	if _, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: tu.Root, McpServers: []acp.McpServer{}}, b); err != nil || a.attachErr != nil {
		h.t.Fatalf("second session: %v %v", err, a.attachErr)
	}
	return a
}

// TestAttackOpKeySquatAcrossSessions: session B, bound to the very tuple
// of session A (only the session id differs, so the session id alone
// keeps the two apart), sends first the op key A is about to use; A's
// write still runs (the key is scoped to A's session), each session's
// receipt is kept under its own key, and each session's retry is answered
// from its own receipt without running again.
func TestAttackOpKeySquatAcrossSessions(t *testing.T) {
	h := newHarness(t)
	h.scriptFiles()
	h.bind()
	b := h.otherSession("sess-B", h.tuple)
	ctx := context.Background()
	writeB := acp.WriteTextFileRequest{SessionId: "sess-B", Path: h.tuple.Root + "/b.txt", Content: "squat", Meta: h.op("victim-key")}
	if _, err := b.conn.WriteTextFile(ctx, writeB); err != nil {
		t.Fatal(err)
	}
	writes := h.fr.count(wire.OpWrite)
	writeA := acp.WriteTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a.txt", Content: "mine", Meta: h.op("victim-key")}
	if _, err := h.agent.conn.WriteTextFile(ctx, writeA); err != nil {
		t.Fatalf("A's write with a key B used first: %v", err) // unscoped: op_key_conflict
	}
	if h.fr.count(wire.OpWrite) != writes+1 || h.fr.last().OpKey != "victim-key" {
		t.Fatal("A's write did not reach the receiver")
	}
	for _, retry := range []func() error{
		func() error { _, err := h.agent.conn.WriteTextFile(ctx, writeA); return err },
		func() error { _, err := b.conn.WriteTextFile(ctx, writeB); return err },
	} {
		if err := retry(); err != nil {
			t.Fatalf("retry: %v, want the session's own receipt", err)
		}
	}
	if n := h.fr.count(wire.OpWrite); n != writes+1 {
		t.Fatalf("%d writes reached the receiver after both retries, want %d (each answered from its receipt)", n, writes+1)
	}
	for session, k := range map[string]string{h.agent.sessionID: h.key("victim-key"), "sess-B": opstore.Key(h.tuple.SHA256(), "sess-B", "victim-key")} {
		raw, err := h.c.store.Get(k)
		if err != nil {
			t.Fatalf("receipt of %s: %v", session, err)
		}
		r, err := opstore.Unmarshal(raw)
		if err != nil || r.SessionID != session {
			t.Fatalf("receipt under %s's key belongs to %q (%v)", session, r.SessionID, err)
		}
	}
}
