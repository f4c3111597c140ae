package custodian

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/receiver/wire"
)

// TestRetentionFollowsLeaseExtension: a key dispatched under a 1 h lease
// that is then extended by 72 h must still be answered from its receipt
// 26 h later (past dispatch + lease + 24 h), never run again. Both ways a
// lease is extended are covered: ExtendLease and a session/load carrying
// a later lease.
func TestRetentionFollowsLeaseExtension(t *testing.T) {
	for _, via := range []string{"ExtendLease", "session/load"} {
		t.Run(via, func(t *testing.T) {
			var now atomic.Pointer[time.Time]
			start := time.Now()
			now.Store(&start)
			clock := func() time.Time { return *now.Load() }
			h := newHarness(t, func(o *Options) { o.Now = clock })
			h.scriptFiles()
			h.bind()
			ctx := context.Background()
			op := func(key string) map[string]any {
				return acpmeta.Op{TupleSHA256: h.tuple.SHA256(), OpKey: key, Deadline: clock().Add(time.Minute)}.Meta()
			}
			req := acp.WriteTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/out.txt", Content: "v1", Meta: op("K")}
			first, err := h.agent.conn.WriteTextFile(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			later := h.lease.Add(72 * time.Hour)
			switch via {
			case "ExtendLease":
				err = h.conn.ExtendLease(ctx, h.agent.sessionID, later)
			case "session/load":
				b := h.binding()
				b.LeaseNotAfter = later
				_, err = h.conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: sid(h), Cwd: h.tuple.Root,
					McpServers: []acp.McpServer{}}, b)
				if err == nil {
					err = h.attach()
				}
			}
			if err != nil {
				t.Fatalf("extend the lease via %s: %v", via, err)
			}
			if err := h.c.store.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			t26 := start.Add(26 * time.Hour)
			now.Store(&t26)
			if err := h.c.store.Prune(ctx); err != nil {
				t.Fatal(err)
			}
			req.Meta = op("K")
			again, err := h.agent.conn.WriteTextFile(ctx, req)
			if err != nil {
				t.Fatalf("retry inside the extended lease: %v", err)
			}
			if n := h.fr.count(wire.OpWrite); n != 1 {
				t.Fatalf("the receiver ran the write %d times; a retry inside the extended lease must replay", n)
			}
			if mustJSON(first) != mustJSON(again) {
				t.Fatalf("replay differs:\n%s\n%s", mustJSON(first), mustJSON(again))
			}
		})
	}
}
