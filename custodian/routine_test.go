package custodian

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/custodian/routine"
	"github.com/tetherdev/tether/receiver/wire"
)

// routineSession is a custodian bound to a real receiver, with the
// connection (RunRoutine is a Conn's) and the agent's side.
type routineSession struct {
	rr    *realReceiver
	c     *Custodian
	conn  *Conn
	agent *acp.AgentSideConnection
	dir   string
	skey  string
}

const routineSID = "sess-routine"

func newRoutineSession(t *testing.T, rr *realReceiver) *routineSession {
	t.Helper()
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	s := &routineSession{rr: rr, dir: filepath.Join(t.TempDir(), "state"), skey: skey}
	s.c, err = New(Options{StateDir: s.dir, AuditKey: []byte(skey)})
	must(t, err)
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	agent := &testAgent{sessionID: routineSID, attachOnNew: true}
	g := &testagent.Gate{R: c2aR, Ready: make(chan struct{})}
	agent.conn = acp.NewAgentSideConnection(agent, a2cW, g)
	close(g.Ready)
	recv := NewReceiver(rr.dialer(), Backoff{}, nil)
	s.conn = s.c.Serve(c2aW, a2cR, ConnOptions{})
	s.agent = agent.conn
	t.Cleanup(func() {
		c2aW.Close()
		a2cW.Close()
		s.conn.Close()
		recv.Close()
		if err := s.c.Close(); err != nil {
			t.Errorf("custodian Close: %v", err)
		}
	})
	ctx := context.Background()
	_, err = s.conn.Initialize(ctx)
	must(t, err)
	_, err = s.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: rr.tuple.Root, McpServers: []acp.McpServer{}},
		Binding{Tuple: rr.tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: rr.tuple.Owner, Receiver: recv})
	must(t, err)
	if agent.attachErr != nil {
		t.Fatal(agent.attachErr)
	}
	return s
}

func (s *routineSession) op(key string) map[string]any {
	return acpmeta.Op{TupleSHA256: s.rr.tuple.SHA256(), OpKey: key, Deadline: time.Now().Add(time.Minute)}.Meta()
}

func (s *routineSession) receipt(t *testing.T, key string) *opstore.Receipt {
	t.Helper()
	raw, err := s.c.store.Get(opstore.Key(s.rr.tuple.SHA256(), routineSID, key))
	must(t, err)
	r, err := opstore.Unmarshal(raw)
	must(t, err)
	return r
}

// exec runs line as a shell command under key, asking to verify verify,
// waits for its exit and releases it.
func (s *routineSession) exec(t *testing.T, key, line string, verify map[string]string) *opstore.Receipt {
	t.Helper()
	ctx := context.Background()
	meta := s.op(key)
	if verify != nil {
		meta = acpmeta.MergeMeta(meta, acpmeta.Verify{Files: verify}.Meta())
	}
	term, err := s.agent.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: routineSID, Command: line, Meta: meta,
		Env: []acp.EnvVariable{{Name: "ROUTINE_WORD", Value: "ok"}}})
	must(t, err)
	_, err = s.agent.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: routineSID, TerminalId: term.TerminalId, Meta: s.op(key + "-wait")})
	must(t, err)
	_, err = s.agent.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: routineSID, TerminalId: term.TerminalId, Meta: s.op(key + "-release")})
	must(t, err)
	return s.receipt(t, key)
}

// routineLine appends one line to runs.txt per run (the side effect the
// test counts) and writes out.txt, whose digest the exec verifies.
const routineLine = `echo ran >> runs.txt && printf "$ROUTINE_WORD" > out.txt`

func (s *routineSession) runs(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile(s.rr.file("runs.txt"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	must(t, err)
	return strings.Count(string(data), "ran\n")
}

// TestIntegrationRoutineSaveRunReplay: a routine saved from a verified
// exec receipt runs once more through the real receiver under a fresh op
// key and is verified again; a retry of that key runs nothing (runs.txt
// gains no line) and returns the same receipt; the same key for another
// routine is op_key_conflict; the audit log, verified, names the
// template's digest for the save and the run.
func TestIntegrationRoutineSaveRunReplay(t *testing.T) {
	rr := startReceiver(t)
	s := newRoutineSession(t, rr)
	src := s.exec(t, "src", routineLine, map[string]string{"out.txt": sha256Hex([]byte("ok"))})
	if src.Outcome != opstore.Verified || src.Exec == nil {
		t.Fatalf("source receipt %s, exec %+v: want verified with its exec recorded", src.Outcome, src.Exec)
	}
	tmpl, digest, err := s.c.SaveRoutine("build", "src", rr.tuple.Owner, false)
	must(t, err)
	if tmpl.Argv[0] != Shell || tmpl.Env["ROUTINE_WORD"] != "ok" || tmpl.Cwd != "." || tmpl.Source.OpKey != "src" {
		t.Fatalf("template %+v", tmpl)
	}
	if s.runs(t) != 1 {
		t.Fatalf("runs.txt has %d runs before the routine ran, want 1", s.runs(t))
	}
	ctx := context.Background()
	r, err := s.conn.RunRoutine(ctx, routineSID, "build", "again-1")
	must(t, err)
	if r.Outcome != opstore.Verified || r.OpKey != "again-1" || r.TupleSHA256 != rr.tuple.SHA256() {
		t.Fatalf("run receipt %s, key %s: want verified under again-1 on the current tuple", r.Outcome, r.OpKey)
	}
	if s.runs(t) != 2 {
		t.Fatalf("runs.txt has %d runs after one routine run, want 2", s.runs(t))
	}
	again, err := s.conn.RunRoutine(ctx, routineSID, "build", "again-1")
	must(t, err)
	if s.runs(t) != 2 {
		t.Fatalf("a retry of the same op key ran the routine again (%d runs)", s.runs(t))
	}
	if string(again.Response) != string(r.Response) || again.Outcome != r.Outcome {
		t.Fatalf("retry answered %s %s, the run %s %s", again.Outcome, again.Response, r.Outcome, r.Response)
	}
	s.conflictOnOtherTemplate(t, tmpl)
	s.auditNamesTemplate(t, digest)
}

// conflictOnOtherTemplate saves a second routine with another env and
// runs it under the key the first one used: op_key_conflict, nothing runs.
func (s *routineSession) conflictOnOtherTemplate(t *testing.T, tmpl *routine.Template) {
	t.Helper()
	other := *tmpl
	other.Name, other.Env = "other", map[string]string{"ROUTINE_WORD": "ok", "EXTRA": "1"}
	st, err := routine.OpenStore(s.dir)
	must(t, err)
	must(t, st.Save(&other, false))
	_, err = s.conn.RunRoutine(context.Background(), routineSID, "other", "again-1")
	wantCode(t, err, errcode.CodeOpKeyConflict)
	if s.runs(t) != 2 {
		t.Fatalf("a conflicting op key ran a routine (%d runs)", s.runs(t))
	}
}

// auditNamesTemplate verifies the audit log and finds the save and run
// records carrying the template's digest.
func (s *routineSession) auditNamesTemplate(t *testing.T, digest string) {
	t.Helper()
	_, err := s.c.Checkpoint()
	must(t, err)
	_, verifier, err := audit.LoadSigner([]byte(s.skey))
	must(t, err)
	_, err = audit.Verify(filepath.Join(s.dir, AuditDir), verifier, nil)
	must(t, err)
	data, err := os.ReadFile(filepath.Join(s.dir, AuditDir, audit.LogFile))
	must(t, err)
	got := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, audit.MaxRecordBytes+1)
	for sc.Scan() {
		r, err := audit.DecodeRecord(sc.Bytes())
		must(t, err)
		if r.Kind == audit.KindRoutine && r.Digests["template"] == digest {
			got[r.Outcome+" "+r.OpKey]++
		}
	}
	if got["saved src"] != 1 || got["run again-1"] != 2 {
		t.Fatalf("routine audit records with the template digest: %v; want one save of src and two runs of again-1", got)
	}
}

// TestIntegrationRoutineSaveRefusals: save refuses, naming the check, an
// unknown op key, an exec that is not verified, a receipt that is not an
// exec, another owner's receipt, a bad name, a verified exec whose request
// was too large to keep in its receipt, and an existing name unless
// replace is asked; nothing is written for a refusal.
func TestIntegrationRoutineSaveRefusals(t *testing.T) {
	rr := startReceiver(t)
	s := newRoutineSession(t, rr)
	s.exec(t, "ok", routineLine, map[string]string{"out.txt": sha256Hex([]byte("ok"))})
	if r := s.exec(t, "unverified", routineLine, nil); r.Outcome != opstore.NeedsReview {
		t.Fatalf("exec without verify: %s, want needs_review", r.Outcome)
	}
	_, err := s.agent.WriteTextFile(context.Background(), acp.WriteTextFileRequest{SessionId: routineSID,
		Path: rr.tuple.Root + "/w.txt", Content: "w", Meta: s.op("write")})
	must(t, err)
	owner := rr.tuple.Owner
	for _, tc := range []struct {
		name, key, owner string
		want             error
	}{
		{"r1", "nope", owner, routine.ErrUnknownOpKey},
		{"r2", "unverified", owner, routine.ErrNotVerified},
		{"r3", "write", owner, routine.ErrNotExec},
		{"r4", "ok", owner + "-other", routine.ErrOtherOwner},
		{"Bad/Name", "ok", owner, routine.ErrBadName},
	} {
		if _, _, err := s.c.SaveRoutine(tc.name, tc.key, tc.owner, false); !errors.Is(err, tc.want) {
			t.Errorf("save %s from %s for %s: %v, want %v", tc.name, tc.key, tc.owner, err, tc.want)
		}
	}
	big := s.exec(t, "big", "true # "+strings.Repeat("x", opstore.MaxExecBytes), map[string]string{"out.txt": sha256Hex([]byte("ok"))})
	if big.Outcome != opstore.Verified || big.Exec != nil {
		t.Fatalf("exec past the kept bound: %s, exec kept %v; want verified with no exec kept", big.Outcome, big.Exec != nil)
	}
	if _, _, err := s.c.SaveRoutine("r5", "big", owner, false); !errors.Is(err, routine.ErrNotExec) {
		t.Errorf("save from an exec whose request was not kept: %v, want ErrNotExec", err)
	}
	entries, err := os.ReadDir(filepath.Join(s.dir, routine.Dir))
	if err == nil && len(entries) != 0 {
		t.Fatalf("refused saves left %d files", len(entries))
	}
	_, _, err = s.c.SaveRoutine("keep", "ok", owner, false)
	must(t, err)
	if _, _, err := s.c.SaveRoutine("keep", "ok", owner, false); !errors.Is(err, routine.ErrExists) {
		t.Fatalf("second save of the same name: %v, want ErrExists", err)
	}
	_, _, err = s.c.SaveRoutine("keep", "ok", owner, true)
	must(t, err)
}

// TestIntegrationRoutineRunRefusals: a run on a session not bound here is
// not_admitted, a malformed op key invalid, an unknown routine not found,
// a routine of another owner than the session's principal denied; none
// of them runs anything (TestIntegrationRoutineSaveRunReplay is the
// positive control: the same routine of the right owner runs).
func TestIntegrationRoutineRunRefusals(t *testing.T) {
	rr := startReceiver(t)
	s := newRoutineSession(t, rr)
	s.exec(t, "ok", routineLine, map[string]string{"out.txt": sha256Hex([]byte("ok"))})
	_, _, err := s.c.SaveRoutine("build", "ok", rr.tuple.Owner, false)
	must(t, err)
	ctx := context.Background()
	_, err = s.conn.RunRoutine(ctx, "not-bound", "build", "k1")
	wantCode(t, err, errcode.CodeNotAdmitted)
	_, err = s.conn.RunRoutine(ctx, routineSID, "build", "bad/key")
	wantCode(t, err, errcode.CodeInvalid)
	if _, err = s.conn.RunRoutine(ctx, routineSID, "missing", "k2"); !errors.Is(err, routine.ErrNotFound) {
		t.Fatalf("unknown routine: %v, want ErrNotFound", err)
	}
	st, err := routine.OpenStore(s.dir)
	must(t, err)
	tmpl, err := st.Load("build")
	must(t, err)
	tmpl.Owner = "mallory"
	must(t, st.Save(tmpl, true))
	_, err = s.conn.RunRoutine(ctx, routineSID, "build", "k3")
	wantCode(t, err, errcode.CodeDenied)
	if s.runs(t) != 1 {
		t.Fatalf("refused runs ran the routine (%d runs)", s.runs(t))
	}
}

// TestExecRecordNotKeptForPlainAgents: a tether agent's exec receipt keeps
// what it ran (the positive control); a plain agent's, keyed by an op key
// the custodian minted, keeps none, so no routine is saved from it.
func TestExecRecordNotKeptForPlainAgents(t *testing.T) {
	for _, plain := range []bool{false, true} {
		h := newHarness(t)
		h.fr.on(wire.OpExecStart, func(context.Context, *wire.Request, any) (any, error) {
			return wire.ExecStartResult{TerminalID: "t-1", PID: 7}, nil
		})
		h.fr.on(wire.OpExecRelease, func(context.Context, *wire.Request, any) (any, error) { return wire.Empty{}, nil })
		req := acp.CreateTerminalRequest{Command: "make"}
		if plain {
			h.connectAgent(false)
			h.bindPlain()
		} else {
			h.bind()
			req.Meta = h.op("k1")
		}
		req.SessionId = sid(h)
		_, err := h.agent.conn.CreateTerminal(context.Background(), req)
		must(t, err)
		rs, err := h.c.store.List()
		must(t, err)
		var execs []*opstore.Receipt
		for _, r := range rs {
			if r.Method == acp.ClientMethodTerminalCreate {
				execs = append(execs, r)
			}
		}
		switch {
		case len(execs) != 1:
			t.Fatalf("plain=%v: %d exec receipts, want 1", plain, len(execs))
		case plain && execs[0].Exec != nil:
			t.Fatalf("a plain agent's exec receipt keeps its request: %+v", execs[0].Exec)
		case !plain && (execs[0].Exec == nil || execs[0].Exec.Argv[2] != "make"):
			t.Fatalf("a tether agent's exec receipt keeps %+v, want argv [/bin/sh -c make]", execs[0].Exec)
		}
	}
}
