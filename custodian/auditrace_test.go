package custodian

import (
	"context"
	"testing"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
)

// TestAuditLossAfterCheckRefusesDispatch breaks the audit log between the
// call's audit check and its dispatch record (a hook closes the log
// there): the call must answer unavailable with nothing sent, and a keyed
// call's receipt must say failed, not sent, so a retry runs nothing.
func TestAuditLossAfterCheckRefusesDispatch(t *testing.T) {
	for _, method := range []string{"fs/read_text_file", "fs/write_text_file"} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t)
			h.scriptFiles()
			h.bind()
			h.c.hook = func(_ context.Context, m, step string) {
				if m == method && step == "before-dispatch-audit" {
					h.c.alog.Close() // a closed log refuses appends, as a broken one does
				}
			}
			n := len(h.fr.ops())
			ctx := context.Background()
			var err error
			if method == "fs/read_text_file" {
				_, err = h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Meta: h.op("r")})
			} else {
				_, err = h.agent.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/a", Content: "x", Meta: h.op("w")})
			}
			wantCode(t, err, errcode.CodeUnavailable)
			if len(h.fr.ops()) != n {
				t.Fatalf("the receiver saw %v after the audit log refused the dispatch record", h.fr.ops()[n:])
			}
			if method == "fs/read_text_file" {
				return
			}
			raw, err := h.c.store.Get(h.key("w"))
			if err != nil {
				t.Fatal(err)
			}
			r, err := opstore.Unmarshal(raw)
			if err != nil {
				t.Fatal(err)
			}
			if r.Outcome != opstore.Failed || r.Note != "not sent" || r.Error == nil || r.Error.Code != string(errcode.CodeUnavailable) {
				t.Fatalf("receipt = %s; want failed, not sent, unavailable", raw)
			}
		})
	}
}
