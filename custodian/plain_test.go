package custodian

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/binding"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// bindPlain binds a plain agent's session: the agent never attaches, the
// custodian does, before session/new returns.
func (h *harness) bindPlain() {
	h.t.Helper()
	ctx := context.Background()
	if _, err := h.conn.Initialize(ctx); err != nil {
		h.t.Fatal(err)
	}
	b := h.binding()
	b.Plain = true
	if _, err := h.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: h.tuple.Root, McpServers: []acp.McpServer{}}, b); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) plainWrite(path string) error {
	_, err := h.agent.conn.WriteTextFile(context.Background(), acp.WriteTextFileRequest{SessionId: sid(h),
		Path: h.tuple.Root + "/" + path, Content: "x"})
	return err
}

// TestPlainAgentTaggedByCustodian: a plain agent's session is attached by
// the custodian before session/new returns; an untagged callback gets the
// binding's digest, a fresh op key per callback and the command budget as
// its deadline; its receipt and its audit records say tagged_by custodian.
// Without plain mode the same callback is a tuple_mismatch that fences.
func TestPlainAgentTaggedByCustodian(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.CommandBudget = 2 * time.Minute })
	h.connectAgent(false) // the agent knows nothing of tether
	h.scriptFiles()
	h.bindPlain()
	if n := h.fr.count(wire.OpAttach); n != 1 {
		t.Fatalf("%d attaches before the first prompt, want the custodian's one", n)
	}
	start := time.Now()
	for _, p := range []string{"a.txt", "b.txt"} {
		if err := h.plainWrite(p); err != nil {
			t.Fatal(err)
		}
	}
	var keys []string
	for _, r := range h.fr.calls {
		if r.Op != wire.OpWrite {
			continue
		}
		keys = append(keys, r.OpKey)
		if r.TupleSHA256 != h.tuple.SHA256() || !strings.HasPrefix(r.OpKey, "plain-") {
			t.Fatalf("receiver got %s digest %s key %s", r.Op, r.TupleSHA256, r.OpKey)
		}
		if d := r.Deadline.Sub(start); d < 110*time.Second || d > 2*time.Minute+time.Second {
			t.Fatalf("deadline %v after the call, want the 2 min command budget", d)
		}
	}
	if len(keys) != 2 || keys[0] == keys[1] {
		t.Fatalf("op keys %v: want one fresh key per callback", keys)
	}
	for _, k := range keys {
		raw, err := h.c.store.Get(h.key(k))
		must(t, err)
		r, err := opstore.Unmarshal(raw)
		must(t, err)
		if r.TaggedBy != TaggedByCustodian || r.Outcome != opstore.Verified {
			t.Fatalf("receipt %s: tagged_by %q outcome %s", k, r.TaggedBy, r.Outcome)
		}
	}
	tagged := 0
	for _, line := range strings.Split(strings.TrimSpace(auditRecords(t, h)), "\n") {
		var r audit.Record
		must(t, json.Unmarshal([]byte(line), &r))
		if r.TaggedBy == TaggedByCustodian {
			tagged++
		}
		if r.Kind == audit.KindDispatch && r.TaggedBy != TaggedByCustodian {
			t.Fatalf("dispatch record without tagged_by: %s", line)
		}
	}
	if tagged < 5 { // the attach, and a dispatch and a result per write
		t.Fatalf("%d records say tagged_by custodian, want at least 5", tagged)
	}
}

// TestPlainAgentStaysStrict attacks plain mode: a present but wrong tag
// still fences (and a fence for a tuple mismatch is not lifted by the
// custodian), a malformed tag naming the right digest is invalid, and a
// callback naming another session is refused; nothing reaches the
// receiver.
func TestPlainAgentStaysStrict(t *testing.T) {
	h := newHarness(t)
	h.connectAgent(false)
	h.scriptFiles()
	h.bindPlain()
	ctx := context.Background()
	before := len(h.fr.ops())
	_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: "someone-else", Path: h.tuple.Root + "/a"})
	wantCode(t, err, errcode.CodeNotAdmitted)
	bad := map[string]any{acpmeta.KeyOp: map[string]any{"tuple_sha256": h.tuple.SHA256(), "op_key": "bad key!", "deadline": time.Now().Add(time.Minute)}}
	_, err = h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: bad})
	wantCode(t, err, errcode.CodeInvalid)
	other := testTuple()
	other.Workspace = "w2"
	wrong := acpmeta.Op{TupleSHA256: other.SHA256(), OpKey: "x", Deadline: time.Now().Add(time.Minute)}.Meta()
	_, err = h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: wrong})
	wantCode(t, err, errcode.CodeTupleMismatch)
	wantCode(t, h.plainWrite("after.txt"), errcode.CodeFenced)
	if got := h.fr.ops()[before:]; len(got) != 0 {
		t.Fatalf("refused callbacks reached the receiver: %v", got)
	}
}

// TestPlainAgentDeadlineIsLeaseWhenSooner: min(command budget, lease).
func TestPlainAgentDeadlineIsLeaseWhenSooner(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.CommandBudget = time.Hour })
	h.lease = time.Now().Add(90 * time.Second)
	h.connectAgent(false)
	h.scriptFiles()
	h.bindPlain()
	must(t, h.plainWrite("a.txt"))
	if r := h.fr.last(); !r.Deadline.Equal(h.lease) {
		t.Fatalf("deadline %s, want the lease's end %s", r.Deadline, h.lease)
	}
}

// TestPlainAgentReattachedAfterTransportLoss: a plain agent cannot call
// `_tether/attach`, so after the receiver link was lost (the binding
// fenced fate_unknown) the custodian attaches again on the next callback.
func TestPlainAgentReattachedAfterTransportLoss(t *testing.T) {
	h := newHarness(t)
	h.connectAgent(false)
	h.scriptFiles()
	h.bindPlain()
	must(t, h.plainWrite("a.txt"))
	b := h.conn.table.Get(h.agent.sessionID)
	h.dropReceiver()
	waitFor(t, func() bool { return b.State() == binding.StateFenced })
	must(t, h.plainWrite("b.txt"))
	if n := h.fr.count(wire.OpAttach); n != 2 {
		t.Fatalf("%d attaches, want 2 (after bind and after the loss)", n)
	}
}
