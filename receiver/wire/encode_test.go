package wire

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// FuzzEncodeRequest: the request envelope written around its args is
// byte for byte what json.Marshal makes of the whole request, whatever
// the op key and args hold (a broken splice would send another request,
// or one the receiver refuses as malformed).
func FuzzEncodeRequest(f *testing.F) {
	f.Add("k", `{"path":"a.txt"}`, uint64(1))
	f.Add(`x","args":0,"y":"`, `{"terminal_id":"t1"}`, uint64(7))
	f.Add(`\",\"args\":0}`, `0`, uint64(1<<60))
	f.Add("", `{"data":"AAEC","offset":0,"transfer_id":",\"args\":0"}`, uint64(2))
	f.Fuzz(func(t *testing.T, opKey, args string, id uint64) {
		raw, err := json.Marshal(json.RawMessage(args))
		if err != nil {
			return // not JSON: encodeArgs never makes it
		}
		req := Request{ID: id, Op: OpRead, TupleSHA256: strings.Repeat("a", 64), OpKey: opKey,
			Deadline: time.Unix(1e9, 5).UTC(), Args: raw}
		want, werr := json.Marshal(&req)
		got, gerr := encodeRequest(&req)
		if (werr == nil) != (gerr == nil) || string(got) != string(want) {
			t.Fatalf("encodeRequest = %s, %v; json.Marshal = %s, %v", got, gerr, want, werr)
		}
		if string(req.Args) != string(raw) {
			t.Fatalf("encodeRequest changed the request's args to %s", req.Args)
		}
	})
}
