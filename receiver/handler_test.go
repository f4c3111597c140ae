package receiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/fsops"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
)

// sideEffectArgs are args for every op that would leave a trace: a file
// named "trace" or a process of the grant uid.
var sideEffectArgs = map[wire.Op]any{
	wire.OpRead:        wire.ReadArgs{Path: "f"},
	wire.OpWrite:       wire.WriteArgs{Path: "trace", Content: "x"},
	wire.OpStat:        wire.StatArgs{Path: "f"},
	wire.OpList:        wire.ListArgs{Path: "."},
	wire.OpHash:        wire.HashArgs{Paths: []string{"f"}},
	wire.OpExecStart:   wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", "echo > trace; sleep 100"}},
	wire.OpExecOutput:  wire.TerminalArgs{TerminalID: "t-x"},
	wire.OpExecWait:    wire.TerminalArgs{TerminalID: "t-x"},
	wire.OpExecKill:    wire.TerminalArgs{TerminalID: "t-x"},
	wire.OpExecRelease: wire.TerminalArgs{TerminalID: "t-x"},
}

// TestRefusedBeforeSideEffects attacks every op with a request no grant
// admits: an unknown tuple, an expired grant, a grant without the op. The
// refusal must carry its code and leave no file and no process behind.
func TestRefusedBeforeSideEffects(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	readOnly := f.newGrant("ro", admission.OpRead)
	expired := f.newGrant("expired", allOps...)
	expired.NotAfter = f.clk.Now().Add(time.Minute)
	unknown := f.newGrant("unknown", allOps...)
	f.publish(f.grant, readOnly, expired)
	f.clk.Advance(2 * time.Minute)

	for op, args := range sideEffectArgs {
		cases := []struct {
			g    admission.Grant
			want errcode.Code
		}{{unknown, errcode.CodeNotAdmitted}, {expired, errcode.CodeLeaseExpired}}
		if grantOp[op] != admission.OpRead {
			cases = append(cases, struct {
				g    admission.Grant
				want errcode.Code
			}{readOnly, errcode.CodeDenied})
		}
		for _, c := range cases {
			if _, err := f.call(c.g, op, args); code(err) != c.want {
				t.Errorf("%s for %s: %v, want %s", op, c.g.Tuple.Allocation, err, c.want)
			}
		}
	}
	for _, g := range []admission.Grant{readOnly, expired, unknown} {
		if _, err := os.Lstat(filepath.Join(g.Tuple.Root, "trace")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("refused request left a trace in %s", g.Tuple.Root)
		}
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("refused exec_start left processes %v", ps)
	}
}

func TestEnvelopeChecks(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	d := f.grant.Tuple.SHA256()
	future := f.clk.Now().Add(time.Minute)
	args := wire.StatArgs{Path: "."}
	cases := []struct {
		name     string
		digest   string
		opKey    string
		deadline time.Time
		want     errcode.Code
	}{
		{"no digest", "", "k", future, errcode.CodeInvalid},
		{"upper-case digest", strings.ToUpper(d), "k", future, errcode.CodeInvalid},
		{"no op key", d, "", future, errcode.CodeInvalid},
		{"op key with space", d, "a b", future, errcode.CodeInvalid},
		{"no deadline", d, "k", time.Time{}, errcode.CodeInvalid},
		{"deadline passed", d, "k", f.clk.Now().Add(-time.Second), errcode.CodeTimeout},
	}
	for _, c := range cases {
		req := &wire.Request{ID: 1, Op: wire.OpStat, TupleSHA256: c.digest, OpKey: c.opKey, Deadline: c.deadline,
			Args: []byte(`{"path":"."}`)}
		if _, err := f.h.Serve(context.Background(), req); code(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
	for _, raw := range []string{`{"path":".","x":1}`, `[]`, `{"path":"."}{}`, ``, `null`} {
		req := &wire.Request{ID: 1, Op: wire.OpStat, TupleSHA256: d, OpKey: "k", Deadline: future, Args: []byte(raw)}
		if _, err := f.h.Serve(context.Background(), req); code(err) != errcode.CodeInvalid {
			t.Errorf("args %q: %v, want invalid", raw, err)
		}
	}
	if _, err := f.call(f.grant, wire.OpStat, args); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
}

// TestOpMapping: each receiver op needs exactly its grant op.
func TestOpMapping(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	grants := map[admission.Op]admission.Grant{}
	for _, op := range allOps {
		grants[op] = f.newGrant("only-"+string(op), op)
	}
	f.publish(grants[admission.OpRead], grants[admission.OpWrite], grants[admission.OpList],
		grants[admission.OpExec], grants[admission.OpKill])
	want := map[wire.Op]admission.Op{wire.OpRead: "read", wire.OpStat: "read", wire.OpHash: "read",
		wire.OpWrite: "write", wire.OpList: "list", wire.OpExecStart: "exec", wire.OpExecOutput: "exec",
		wire.OpExecWait: "exec", wire.OpExecRelease: "exec", wire.OpExecKill: "kill"}
	for op, needs := range want {
		for gop, g := range grants {
			_, err := f.call(g, op, sideEffectArgs[op])
			denied := code(err) == errcode.CodeDenied
			if denied != (gop != needs) {
				t.Errorf("%s with a grant of only %s: %v (needs %s)", op, gop, err, needs)
			}
		}
	}
}

func TestAttach(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	kill := f.newGrant("kill-only", admission.OpKill)
	f.publish(f.grant, kill)
	res, err := f.call(kill, wire.OpAttach, wire.AttachArgs{})
	ar, _ := res.(*wire.AttachResult)
	if err != nil || ar.GrantGeneration != 2 || !ar.NotAfter.Equal(kill.NotAfter) || len(ar.Ops) != 1 || ar.Ops[0] != "kill" {
		t.Fatalf("attach = %+v, %v", res, err)
	}
	if _, err := f.call(f.newGrant("nobody"), wire.OpAttach, wire.AttachArgs{}); code(err) != errcode.CodeNotAdmitted {
		t.Fatalf("attach without grant: %v", err)
	}
	f.clk.Advance(61 * time.Minute)
	if _, err := f.call(kill, wire.OpAttach, wire.AttachArgs{}); code(err) != errcode.CodeLeaseExpired {
		t.Fatalf("attach after not_after: %v", err)
	}
}

// lyingSource answers with whatever grant it holds, for any digest and op:
// the handler must not trust it blindly.
type lyingSource struct{ g admission.Grant }

func (l lyingSource) Lookup(context.Context, string, admission.Op) (admission.Grant, uint64, error) {
	return l.g, 7, nil
}

func TestHandlerRechecksGrant(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	other := f.newGrant("other", allOps...)
	cases := map[string]struct {
		mut  func(*admission.Grant)
		want errcode.Code
	}{
		"other tuple": {func(g *admission.Grant) { g.Tuple = other.Tuple }, errcode.CodeNotAdmitted},
		"expired":     {func(g *admission.Grant) { g.NotAfter = f.clk.Now().Add(-time.Second) }, errcode.CodeLeaseExpired},
		"op missing":  {func(g *admission.Grant) { g.Ops = []admission.Op{admission.OpRead} }, errcode.CodeDenied},
		"uid 0":       {func(g *admission.Grant) { g.UID = 0 }, errcode.CodeDenied},
		"gid 0":       {func(g *admission.Grant) { g.GID = 0 }, errcode.CodeDenied},
		"group 0":     {func(g *admission.Grant) { g.Groups = []uint32{0} }, errcode.CodeDenied},
	}
	for name, c := range cases {
		g := f.grant
		g.Groups = append([]uint32{}, g.Groups...)
		c.mut(&g)
		h, err := NewHandler(Options{Grants: lyingSource{g}, Now: f.clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		saved := f.h
		f.h = h
		_, err = f.call(f.grant, wire.OpExecStart, sideEffectArgs[wire.OpExecStart])
		f.h = saved
		if code(err) != c.want {
			t.Errorf("%s: %v, want %s", name, err, c.want)
		}
		h.Close()
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("a lying grant source started %v", ps)
	}
	if ps := procsOfUID(t, 0); len(ps) == 0 {
		t.Fatal("procsOfUID is broken")
	}
}

func TestFileOps(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	old := syscall.Umask(0) // the receiver's umask must not matter
	defer syscall.Umask(old)
	g := f.grant
	res, err := f.call(g, wire.OpWrite, wire.WriteArgs{Path: "a.txt", Content: "one\ntwo\n", Mode: 0o640})
	wr, _ := res.(*wire.WriteResult)
	if err != nil || wr.Size != 8 {
		t.Fatalf("write = %+v, %v", res, err)
	}
	res, err = f.call(g, wire.OpStat, wire.StatArgs{Path: "a.txt"})
	st, _ := res.(*wire.StatResult)
	if err != nil || st.Mode != 0o640 || st.UID != gUID || st.GID != gGID || st.Type != "file" {
		t.Fatalf("stat = %+v, %v", res, err)
	}
	res, err = f.call(g, wire.OpRead, wire.ReadArgs{Path: "a.txt", Line: 2, Limit: 1})
	rr, _ := res.(*wire.ReadResult)
	if err != nil || rr.Content != "two\n" || rr.SHA256 != wr.SHA256 {
		t.Fatalf("read = %+v, %v", res, err)
	}
	if _, err := f.call(g, wire.OpWrite, wire.WriteArgs{Path: "a.txt", Content: "x", ExpectSHA256: strings.Repeat("0", 64)}); code(err) != errcode.CodePrecondition {
		t.Fatalf("stale edit: %v", err)
	}
	if _, err := f.call(g, wire.OpWrite, wire.WriteArgs{Path: "a.txt", Content: "x", ExpectAbsent: true}); code(err) != errcode.CodePrecondition {
		t.Fatalf("expect_absent on existing: %v", err)
	}
	res, err = f.call(g, wire.OpList, wire.ListArgs{Path: "."})
	lr, _ := res.(*wire.ListResult)
	if err != nil || len(lr.Entries) != 1 || lr.Entries[0].Name != "a.txt" {
		t.Fatalf("list = %+v, %v", res, err)
	}
	res, err = f.call(g, wire.OpHash, wire.HashArgs{Paths: []string{"a.txt", "none"}})
	hr, _ := res.(*wire.HashResult)
	if err != nil || hr.SHA256["a.txt"] != wr.SHA256 || hr.SHA256["none"] != "" {
		t.Fatalf("hash = %+v, %v", res, err)
	}
	os.Symlink("/etc", filepath.Join(g.Tuple.Root, "etc"))
	for op, args := range map[wire.Op]any{
		wire.OpRead: wire.ReadArgs{Path: "../../admission/" + admission.FileName}, wire.OpRead + "2": nil,
		wire.OpWrite: wire.WriteArgs{Path: "etc/evil", Content: "x"}, wire.OpList: wire.ListArgs{Path: "etc"},
		wire.OpStat: wire.StatArgs{Path: "/etc/passwd"}, wire.OpHash: wire.HashArgs{Paths: []string{"etc/passwd"}},
	} {
		if args == nil {
			continue
		}
		if _, err := f.call(g, op, args); code(err) != errcode.CodePathEscape {
			t.Errorf("%s %+v: %v, want path_escape", op, args, err)
		}
	}
	if _, err := os.Lstat("/etc/evil"); err == nil {
		t.Fatal("a write escaped into /etc")
	}
	if _, err := f.call(g, wire.OpRead, wire.ReadArgs{Path: "missing"}); code(err) != errcode.CodeNotFound {
		t.Fatalf("missing file: %v", err)
	}
	big := strings.Repeat("x", int(g.Limits.MaxFileBytes)+1)
	if _, err := f.call(g, wire.OpWrite, wire.WriteArgs{Path: "big", Content: big}); code(err) != errcode.CodeTooLarge {
		t.Fatalf("write beyond max_file_bytes: %v", err)
	}
}

func TestErrorMapping(t *testing.T) {
	h := &Handler{log: nil}
	h.log = discardLogger()
	cases := map[error]errcode.Code{
		&spawn.CapError{Missing: []string{"KILL"}}: errcode.CodeDenied,
		spawn.ErrLoaderEnv:                         errcode.CodeDenied,
		fsops.ErrEscape:                            errcode.CodePathEscape,
		errors.New("boom"):                         errcode.CodeInternal,
	}
	for err, want := range cases {
		if got := code(h.toWire(wire.OpExecStart, err)); got != want {
			t.Errorf("%v -> %s, want %s", err, got, want)
		}
	}
	if e := h.toWire(wire.OpRead, errors.New("secret detail")); strings.Contains(e.Error(), "secret") {
		t.Fatalf("internal error leaked: %v", e)
	}
}

// TestResultsFitAFrame: a listing that would not fit in a result is
// truncated (and says so), and a read that would not fit is too_large.
func TestResultsFitAFrame(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{Limits: Limits{MaxResultBytes: 64 << 10, MaxFileBytes: 1 << 20}})
	dir := filepath.Join(f.grant.Tuple.Root, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("n", 200)
	for i := range 600 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%04d", long, i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err := f.call(f.grant, wire.OpList, wire.ListArgs{Path: "many"})
	lr, _ := res.(*wire.ListResult)
	if err != nil || !lr.Truncated || len(lr.Entries) == 0 || len(lr.Entries) >= 600 {
		t.Fatalf("list of 600 long names within 64 KiB: %d entries, truncated %v, %v", len(lr.Entries), lr.Truncated, err)
	}
	if b, _ := json.Marshal(lr); len(b) > 64<<10 {
		t.Fatalf("list result is %d bytes", len(b))
	}
	if err := os.WriteFile(filepath.Join(f.grant.Tuple.Root, "big"), []byte(strings.Repeat("a\n", 40<<10)), 0o644); err != nil {
		t.Fatal(err)
	}
	// A selection over the bound is answered chunked (no content, the
	// whole file's size and digest), for the client to read in chunks.
	rr, err := f.call(f.grant, wire.OpRead, wire.ReadArgs{Path: "big"})
	if r, _ := rr.(*wire.ReadResult); err != nil || !r.Chunked || r.Content != "" || r.Size != 80<<10 || len(r.SHA256) != 64 {
		t.Fatalf("read of 80 KiB into a 64 KiB result: %+v, %v", rr, err)
	}
	if _, err := f.call(f.grant, wire.OpRead, wire.ReadArgs{Path: "big", Line: 1, Limit: 100}); err != nil {
		t.Fatalf("read of 100 lines: %v", err)
	}
}
