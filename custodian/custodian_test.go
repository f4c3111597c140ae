package custodian

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

func sid(h *harness) acp.SessionId { return acp.SessionId(h.agent.sessionID) }

func (h *harness) scriptFiles() {
	h.fr.on(wire.OpRead, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		args := a.(*wire.ReadArgs)
		return wire.ReadResult{Content: "hello from " + args.Path, Size: 5, SHA256: strings.Repeat("c", 64)}, nil
	})
	h.fr.on(wire.OpWrite, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		args := a.(*wire.WriteArgs)
		return wire.WriteResult{Size: int64(len(args.Content)), SHA256: sha256Hex([]byte(args.Content))}, nil
	})
}

func TestReadGoesToTheReceiverUnderTheRoot(t *testing.T) {
	h := newHarness(t)
	h.scriptFiles()
	h.bind()
	resp, err := h.agent.conn.ReadTextFile(context.Background(), acp.ReadTextFileRequest{SessionId: sid(h),
		Path: h.tuple.Root + "/src/main.go", Meta: h.op("r1")})
	if err != nil {
		t.Fatal(err)
	}
	req := h.fr.last()
	if req.Op != wire.OpRead || req.TupleSHA256 != h.tuple.SHA256() || req.OpKey != "r1" {
		t.Fatalf("receiver got %+v", req)
	}
	if resp.Content != "hello from src/main.go" {
		t.Fatalf("content %q: the path was not made relative to the root", resp.Content)
	}
	if f, ok, err := acpmeta.FileFromMeta(resp.Meta); !ok || err != nil || f.SHA256 != strings.Repeat("c", 64) {
		t.Fatalf("file meta = %+v %v %v", f, ok, err)
	}
}

// TestRefusalsForwardNothing attacks the binding checks: every refusal
// names its code and the receiver sees no request at all.
func TestRefusalsForwardNothing(t *testing.T) {
	h := newHarness(t)
	h.scriptFiles()
	h.bind()
	before := len(h.fr.ops())
	ctx := context.Background()
	other := testTuple()
	other.Workspace = "w2"
	wrong := acpmeta.Op{TupleSHA256: other.SHA256(), OpKey: "x", Deadline: time.Now().Add(time.Minute)}.Meta()
	cases := []struct {
		name string
		call func() error
		code errcode.Code
	}{
		{"unbound session", func() error {
			_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: "nope", Path: h.tuple.Root + "/a", Meta: h.op("k1")})
			return err
		}, errcode.CodeNotAdmitted},
		{"path outside root", func() error {
			_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: "/etc/shadow", Meta: h.op("k2")})
			return err
		}, errcode.CodePathEscape},
		{"dotdot", func() error {
			_, err := h.agent.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/../w2/x", Content: "x", Meta: h.op("k3")})
			return err
		}, errcode.CodePathEscape},
		{"sibling prefix", func() error {
			_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "2/secret", Meta: h.op("k4")})
			return err
		}, errcode.CodePathEscape},
		{"op meta missing", func() error {
			_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a"})
			return err
		}, errcode.CodeTupleMismatch},
		{"wrong digest", func() error {
			_, err := h.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid(h), Command: "/bin/true", Meta: wrong})
			return err
		}, errcode.CodeTupleMismatch},
		{"fenced after mismatch", func() error {
			_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("k5")})
			return err
		}, errcode.CodeFenced},
	}
	for _, c := range cases {
		wantCode(t, c.call(), c.code)
		if n := len(h.fr.ops()); n != before {
			t.Fatalf("%s: the receiver saw %v", c.name, h.fr.ops()[before:])
		}
	}
	if err := h.attach(); err != nil {
		t.Fatalf("reattach: %v", err)
	}
	if _, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("k6")}); err != nil {
		t.Fatalf("read after reattach: %v", err)
	}
}

func TestNothingRunsBeforeAttach(t *testing.T) {
	h := newHarness(t)
	h.connectAgent(false)
	h.scriptFiles()
	h.bind()
	_, err := h.agent.conn.ReadTextFile(context.Background(), acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("k")})
	wantCode(t, err, errcode.CodeFenced)
	if h.fr.count(wire.OpRead) != 0 {
		t.Fatal("a read reached the receiver before attach")
	}
	if err := h.attach(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.agent.conn.ReadTextFile(context.Background(), acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("k2")}); err != nil {
		t.Fatal(err)
	}
}

func TestAttachRefusals(t *testing.T) {
	h := newHarness(t)
	h.connectAgent(false)
	h.bind()
	ctx := context.Background()
	_, err := h.agent.conn.CallExtension(ctx, acpmeta.MethodAttach, acpmeta.AttachRequest{SessionID: "ghost", TupleSHA256: h.tuple.SHA256()})
	wantCode(t, err, errcode.CodeNotAdmitted)
	other := testTuple()
	other.Site = "remote"
	_, err = h.agent.conn.CallExtension(ctx, acpmeta.MethodAttach, acpmeta.AttachRequest{SessionID: h.agent.sessionID, TupleSHA256: other.SHA256()})
	wantCode(t, err, errcode.CodeTupleMismatch)
	h.fr.on(wire.OpAttach, func(context.Context, *wire.Request, any) (any, error) {
		return nil, errcode.Errorf(errcode.CodeNotAdmitted, "no grant covers the tuple")
	})
	wantCode(t, h.attach(), errcode.CodeNotAdmitted)
	h.fr.on(wire.OpAttach, func(context.Context, *wire.Request, any) (any, error) {
		return wire.AttachResult{GrantGeneration: 3, NotAfter: time.Now().Add(-time.Second)}, nil
	})
	wantCode(t, h.attach(), errcode.CodeLeaseExpired)
	if _, err := h.agent.conn.CallExtension(ctx, "_tether/other", map[string]any{}); err == nil {
		t.Fatal("unknown extension method accepted")
	}
}

func TestSameKeyReplaysWithoutRunningAgain(t *testing.T) {
	h := newHarness(t)
	h.scriptFiles()
	h.bind()
	ctx := context.Background()
	req := acp.WriteTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/out.txt", Content: "v1", Meta: h.op("w-1")}
	first, err := h.agent.conn.WriteTextFile(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	req.Meta = h.op("w-1") // a retry: same key, a later deadline
	again, err := h.agent.conn.WriteTextFile(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if h.fr.count(wire.OpWrite) != 1 {
		t.Fatalf("the receiver ran the write %d times", h.fr.count(wire.OpWrite))
	}
	if mustJSON(first) != mustJSON(again) {
		t.Fatalf("replay differs:\n%s\n%s", mustJSON(first), mustJSON(again))
	}
	req.Content = "v2"
	_, err = h.agent.conn.WriteTextFile(ctx, req)
	wantCode(t, err, errcode.CodeOpKeyConflict)
	if h.fr.count(wire.OpWrite) != 1 {
		t.Fatal("a conflicting request reached the receiver")
	}
	raw, err := h.c.store.Get(h.key("w-1"))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := opstore.Unmarshal(raw)
	if r.Outcome != opstore.Verified || r.Files[0].Actual != sha256Hex([]byte("v1")) {
		t.Fatalf("receipt = %s", raw)
	}
}

func TestConcurrentDuplicateIsConflict(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	h.fr.on(wire.OpWrite, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		<-release
		return wire.WriteResult{Size: 1, SHA256: sha256Hex([]byte("x"))}, nil
	})
	h.bind()
	ctx := context.Background()
	req := acp.WriteTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/x", Content: "x", Meta: h.op("dup")}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := h.agent.conn.WriteTextFile(ctx, req); err != nil {
			t.Errorf("first write: %v", err)
		}
	}()
	waitFor(t, func() bool { return h.fr.count(wire.OpWrite) == 1 })
	_, err := h.agent.conn.WriteTextFile(ctx, req)
	wantCode(t, err, errcode.CodeOpKeyConflict)
	close(release)
	wg.Wait()
}

func TestWriteExpectBecomesAtomicPrecondition(t *testing.T) {
	h := newHarness(t)
	h.fr.on(wire.OpWrite, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		args := a.(*wire.WriteArgs)
		if args.ExpectSHA256 != strings.Repeat("d", 64) {
			return nil, errcode.Errorf(errcode.CodePrecondition, "expect not passed: %+v", args)
		}
		return nil, errcode.Errorf(errcode.CodePrecondition, "file changed")
	})
	h.bind()
	meta := acpmeta.MergeMeta(h.op("e1"), acpmeta.Expect{SHA256: strings.Repeat("d", 64)}.Meta())
	_, err := h.agent.conn.WriteTextFile(context.Background(), acp.WriteTextFileRequest{SessionId: sid(h),
		Path: h.tuple.Root + "/f", Content: "new", Meta: meta})
	wantCode(t, err, errcode.CodePrecondition)
	raw, _ := h.c.store.Get(h.key("e1"))
	if r, _ := opstore.Unmarshal(raw); r.Outcome != opstore.Failed || r.Error.Code != string(errcode.CodePrecondition) {
		t.Fatalf("receipt = %s", raw)
	}
}

func TestDeadlineIsTheMinimum(t *testing.T) {
	budget := 2 * time.Second
	h := newHarness(t, func(o *Options) { o.CommandBudget = budget })
	h.scriptFiles()
	h.bind()
	ctx := context.Background()
	start := time.Now()
	far := acpmeta.Op{TupleSHA256: h.tuple.SHA256(), OpKey: "d1", Deadline: start.Add(time.Hour)}.Meta()
	h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: far})
	if dl := h.fr.last().Deadline; dl.Before(start.Add(budget-time.Second)) || dl.After(time.Now().Add(budget)) {
		t.Fatalf("deadline %v is not now + command budget", dl)
	}
	near := start.Add(500 * time.Millisecond)
	soon := acpmeta.Op{TupleSHA256: h.tuple.SHA256(), OpKey: "d2", Deadline: near}.Meta()
	h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: soon})
	if dl := h.fr.last().Deadline; !dl.Equal(near.UTC()) && !dl.Equal(near) {
		t.Fatalf("deadline %v, want the request's %v", dl, near)
	}
	lease := time.Now().Add(700 * time.Millisecond)
	h.conn.table.Get(h.agent.sessionID).Shorten(lease)
	h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("d3")})
	if dl := h.fr.last().Deadline; !dl.Equal(lease.UTC()) {
		t.Fatalf("deadline %v, want the lease's end %v", dl, lease)
	}
	time.Sleep(time.Until(lease) + 10*time.Millisecond)
	n := len(h.fr.ops())
	_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("d4")})
	wantCode(t, err, errcode.CodeLeaseExpired)
	if len(h.fr.ops()) != n {
		t.Fatal("a request was sent after the lease ended")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func auditRecords(t *testing.T, h *harness) string {
	t.Helper()
	if _, err := h.c.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(h.dir, AuditDir, audit.LogFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestReadOfAMissingFileIsResourceNotFound: the receiver's not_found for a
// read reaches the agent as ACP's own "resource not found" (-32002, message
// "Resource not found: PATH", data.uri), which agents recognise as a
// missing file, with data.tether still not_found; a write's not_found keeps
// tether's -32010.
func TestReadOfAMissingFileIsResourceNotFound(t *testing.T) {
	h := newHarness(t)
	h.fr.on(wire.OpRead, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		return nil, errcode.Errorf(errcode.CodeNotFound, "%s does not exist", a.(*wire.ReadArgs).Path)
	})
	h.fr.on(wire.OpWrite, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		return nil, errcode.Errorf(errcode.CodeNotFound, "the directory of %s does not exist", a.(*wire.WriteArgs).Path)
	})
	h.bind()
	path := h.tuple.Root + "/new/missing.txt"
	_, err := h.agent.conn.ReadTextFile(context.Background(), acp.ReadTextFileRequest{SessionId: sid(h), Path: path, Meta: h.op("r1")})
	wantCode(t, err, errcode.CodeNotFound)
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32002 || re.Message != "Resource not found: "+path {
		t.Fatalf("read of a missing file answered %v; want code -32002, message %q", err, "Resource not found: "+path)
	}
	data, _ := re.Data.(map[string]any)
	if data["uri"] != path || data["message"] != "new/missing.txt does not exist" {
		t.Errorf("data %v: want uri %s and the receiver's message", re.Data, path)
	}
	_, err = h.agent.conn.WriteTextFile(context.Background(), acp.WriteTextFileRequest{SessionId: sid(h), Path: path, Content: "x", Meta: h.op("w1")})
	wantCode(t, err, errcode.CodeNotFound)
	if !errors.As(err, &re) || re.Code != acpmeta.ErrorCode {
		t.Errorf("write's not_found answered %v; want tether's code %d", err, acpmeta.ErrorCode)
	}
}
