package custodian

import (
	"context"
	"errors"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
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

// TestReadsAreNotKeyed: read-only callbacks leave no receipt (they spend
// no durable write).
func TestReadsAreNotKeyed(t *testing.T) {
	h := newHarness(t)
	h.scriptFiles()
	h.scriptExec(0, nil)
	h.bind()
	ctx := context.Background()
	for i := range 3 {
		if _, err := h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a",
			Meta: h.op("read-" + string(rune('0'+i)))}); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := h.c.store.List()
	if err != nil || len(rs) != 0 {
		t.Fatalf("reads left %d receipts (%v); they must not be keyed", len(rs), err)
	}
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
	if b := h.conn.table.get(h.agent.sessionID); b == nil || !b.Tuple.Equal(h.tuple) || !b.lease().Equal(later) {
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
