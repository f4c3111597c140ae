package custodian

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

func TestBackoffIsBounded(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 200 * time.Millisecond}
	for attempt := range 100 {
		d := b.delay(attempt)
		if d < b.Min/2 || d > b.Max {
			t.Fatalf("attempt %d: delay %v outside [%v, %v]", attempt, d, b.Min/2, b.Max)
		}
	}
	if d := b.delay(0); d > b.Min {
		t.Fatalf("first delay %v exceeds Min %v", d, b.Min)
	}
}

// TestReadsAreKeyedForReplay: a read's receipt keeps its answer, so a
// retry with the same op key and arguments gets the content first read,
// byte for byte, and sends nothing, even after the file changed; other
// arguments under the key are op_key_conflict.
func TestReadsAreKeyedForReplay(t *testing.T) {
	h := newHarness(t)
	var reads atomic.Int32
	h.fr.on(wire.OpRead, func(context.Context, *wire.Request, any) (any, error) {
		if reads.Add(1) == 1 {
			return wire.ReadResult{Content: "first content", Size: 13, SHA256: strings.Repeat("c", 64)}, nil
		}
		return wire.ReadResult{Content: "changed since", Size: 13, SHA256: strings.Repeat("d", 64)}, nil
	})
	h.bind()
	ctx := context.Background()
	req := acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("read-1")}
	first, err := h.agent.conn.ReadTextFile(ctx, req)
	must(t, err)
	again, err := h.agent.conn.ReadTextFile(ctx, req)
	must(t, err)
	a, _ := json.Marshal(first)
	b, _ := json.Marshal(again)
	if string(a) != string(b) || first.Content == "changed since" {
		t.Fatalf("retry answered %s, want the first answer %s", b, a)
	}
	if n := h.fr.count(wire.OpRead); n != 1 {
		t.Fatalf("%d reads sent, want 1: a retry reads nothing", n)
	}
	raw, err := h.c.store.Get(h.key("read-1"))
	must(t, err)
	r, err := opstore.Unmarshal(raw)
	must(t, err)
	if r.Outcome != opstore.NeedsReview || string(r.Response) != string(a) {
		t.Fatalf("receipt %s: want needs_review holding the answer %s", raw, a)
	}
	other := req
	other.Line = new(2)
	_, err = h.agent.conn.ReadTextFile(ctx, other)
	wantCode(t, err, errcode.CodeOpKeyConflict)
}

func TestExtendLease(t *testing.T) {
	h := newHarness(t)
	h.scriptFiles()
	h.bind()
	later := h.lease.Add(time.Hour)
	if err := h.conn.ExtendLease(context.Background(), h.agent.sessionID, later); err != nil {
		t.Fatalf("later lease refused: %v", err)
	}
	if err := h.conn.ExtendLease(context.Background(), h.agent.sessionID, h.lease); !errors.Is(err, admission.ErrLeaseNotLater) {
		t.Fatalf("earlier lease: %v, want ErrLeaseNotLater", err)
	}
	if err := h.conn.ExtendLease(context.Background(), "ghost", later); !errors.Is(err, ErrBind) {
		t.Fatalf("unbound session: %v, want ErrBind", err)
	}
	// A session/load naming another tuple is refused, the binding kept.
	other := h.binding()
	other.Tuple.Sandbox = "elsewhere"
	_, err := h.conn.LoadSession(context.Background(), acp.LoadSessionRequest{SessionId: sid(h), Cwd: h.tuple.Root,
		McpServers: []acp.McpServer{}}, other)
	if !errors.Is(err, admission.ErrTupleChanged) {
		t.Fatalf("load with another tuple: %v, want ErrTupleChanged", err)
	}
	if b := h.conn.table.Get(h.agent.sessionID); b == nil || !b.Tuple.Equal(h.tuple) || !b.Lease().Equal(later) {
		t.Fatal("the binding changed after a refused load")
	}
}

// TestBrokenAuditRefusesToAct: when the audit log cannot record, the
// custodian refuses attach and every callback (unavailable) and sends
// nothing.
func TestBrokenAuditRefusesToAct(t *testing.T) {
	h := newHarness(t)
	h.scriptFiles()
	h.bind()
	h.c.alog.Close() // a closed log refuses appends, as a broken one does
	n := len(h.fr.ops())
	ctx := context.Background()
	_, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("r")})
	wantCode(t, err, "unavailable")
	_, err = h.agent.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Content: "x", Meta: h.op("w")})
	wantCode(t, err, "unavailable")
	wantCode(t, h.attach(), "unavailable")
	if len(h.fr.ops()) != n {
		t.Fatalf("the receiver saw %v while the audit log was down", h.fr.ops()[n:])
	}
}
