package custodian

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/custodian/audit"
)

// floodCounts is how many calls the records of one method counted (one
// each, or a folded record's counts), and how many records that took.
type floodCounts struct{ calls, records int64 }

// countFlood counts the records of kind and the folded ones, by method
// and by whether the session was bound ("bound "+method, or the method).
func countFlood(t *testing.T, rs []*audit.Record, kind audit.Kind) map[string]*floodCounts {
	t.Helper()
	out := map[string]*floodCounts{}
	for _, r := range rs {
		if r.Kind != kind && r.Kind != audit.KindFolded {
			continue
		}
		key := r.Method
		if r.TupleSHA256 != "" {
			key = "bound " + key
		}
		if out[key] == nil {
			out[key] = &floodCounts{}
		}
		out[key].records++
		if r.Kind == kind {
			out[key].calls++
			continue
		}
		for outcome, n := range r.Folded {
			if n.Count < 1 || n.First.IsZero() || n.First.After(n.Last) {
				t.Fatalf("folded %s: %+v", outcome, n)
			}
			out[key].calls += n.Count
		}
	}
	return out
}

// floodPermissionsAndAttaches sends n permission requests and n attaches
// of h's bound session, and n of each of a session not bound; it returns
// how long that took.
func floodPermissionsAndAttaches(t *testing.T, h *harness, n int) time.Duration {
	t.Helper()
	ctx := context.Background()
	opts := []acp.PermissionOption{{OptionId: "r1", Kind: acp.PermissionOptionKindRejectOnce, Name: "no"}}
	start := time.Now()
	for i := range n {
		if _, err := h.agent.conn.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: sid(h), Options: opts,
			ToolCall: acp.ToolCallUpdate{ToolCallId: acp.ToolCallId("tc-" + itoa(i))}}); err != nil {
			t.Fatal(err)
		}
		must(t, h.attach())
		if _, err := h.agent.conn.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: "nobody", Options: opts,
			ToolCall: acp.ToolCallUpdate{ToolCallId: "tc"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.agent.conn.CallExtension(ctx, acpmeta.MethodAttach,
			acpmeta.AttachRequest{SessionID: "nobody", TupleSHA256: h.tuple.SHA256()}); err == nil {
			t.Fatal("an attach of a session not bound was confirmed")
		}
	}
	return time.Since(start)
}

// TestAttackPermissionAndAttachFloodsAreFolded: 5,000 permission
// requests and 5,000 confirmed attaches of a bound session, and 5,000
// permission requests and 5,000 refused attaches of a session not bound,
// write a bounded number of records: per window of RefusalRecordEvery at
// most AuditBudget one by one and one folded record per method and
// session, every call still counted (the folded records say how many and
// over what time), and the log verifies. Positive control: with the
// budget off each permission request and each confirmed attach is its own
// record.
func TestAttackPermissionAndAttachFloodsAreFolded(t *testing.T) {
	const n, budget = 5000, 16
	every := time.Second
	h := newHarness(t, func(o *Options) { o.AuditBudget, o.RefusalRecordEvery = budget, every })
	h.bind()
	before := len(auditLog(t, h))
	elapsed := floodPermissionsAndAttaches(t, h, n)
	rs := auditLog(t, h)
	windows := int64(elapsed/every) + 2 // the flood's windows, and the one a checkpoint cut
	t.Logf("%d of each in %s: %d records", n, elapsed, len(rs)-before)
	permsBy := countFlood(t, rs, audit.KindPermission)
	perms, unbound := permsBy["bound "+acp.ClientMethodSessionRequestPermission], permsBy[acp.ClientMethodSessionRequestPermission]
	attaches := countFlood(t, rs, audit.KindAttach)["bound "+acpmeta.MethodAttach]
	for name, got := range map[string]*floodCounts{"permission": perms, "unbound permission": unbound, "attach": attaches} {
		if got == nil || got.records > windows*(budget+1) {
			t.Fatalf("%s: %+v, want at most %d records over %s", name, got, windows*(budget+1), elapsed)
		}
	}
	if perms.calls != n || unbound.calls != n || attaches.calls != n+1 { // the bind's attach too
		t.Fatalf("counted %d+%d permission requests and %d attaches, want %d each and %d", perms.calls, unbound.calls, attaches.calls, n, n+1)
	}
	refused, records := refusalCounts(rs)
	if refused["not_admitted"] != n || int64(records) > windows {
		t.Fatalf("refused attaches %v in %d records, want %d in at most %d", refused, records, n, windows)
	}
	_, verifier, err := audit.LoadSigner(h.c.opts.AuditKey)
	must(t, err)
	if _, err := audit.Verify(filepath.Join(h.dir, AuditDir), verifier, nil); err != nil {
		t.Fatalf("audit verify: %v", err)
	}

	off := newHarness(t, func(o *Options) { o.AuditBudget = -1 })
	off.bind()
	floodPermissionsAndAttaches(t, off, n)
	rs = auditLog(t, off)
	permsBy = countFlood(t, rs, audit.KindPermission)
	perms, unbound = permsBy["bound "+acp.ClientMethodSessionRequestPermission], permsBy[acp.ClientMethodSessionRequestPermission]
	attaches = countFlood(t, rs, audit.KindAttach)["bound "+acpmeta.MethodAttach]
	if perms.records != n || unbound.records != n || attaches.records != n+1 {
		t.Fatalf("positive control: budget off, %d+%d permission and %d attach records, want %d each and %d",
			perms.records, unbound.records, attaches.records, n, n+1)
	}
}
