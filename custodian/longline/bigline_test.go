package longline

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"
)

// must fails the test on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestLongLineRefusals: a long message is decoded once, as a write; a
// long message of another method is refused (-32600) whatever its params,
// a long write whose params do not decode is invalid params (-32602),
// and a long message that is no request is dropped. Each answer keeps the
// request's id.
func TestLongLineRefusals(t *testing.T) {
	pad := strings.Repeat("x", 64)
	cases := []struct {
		name, line string
		code       int // 0: no answer
	}{
		{"read", `{"jsonrpc":"2.0","id":7,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/` + pad + `"}}`, -32600},
		{"other params", `{"jsonrpc":"2.0","id":7,"method":"terminal/create","params":{"sessionId":"s","command":"` + pad + `","args":[1]}}`, -32600},
		{"write of a number", `{"jsonrpc":"2.0","id":7,"method":"fs/write_text_file","params":{"sessionId":"s","path":"/r/a","content":5}}`, -32602},
		{"not a request", `{"jsonrpc":"2.0","method":"fs/write_text_file","params":{"content":"` + pad + `"}}`, 0},
		{"not json", `{"jsonrpc":"2.0","id":7,` + pad, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			ll := &Reader{out: &LockedWriter{w: &out}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			ll.serveLong([]byte(c.line + "\n"))
			ll.calls.Wait()
			if c.code == 0 {
				if out.Len() != 0 {
					t.Fatalf("answered %s, want nothing", out.String())
				}
				return
			}
			var resp struct {
				ID    int               `json:"id"`
				Error *acp.RequestError `json:"error"`
			}
			if err := json.Unmarshal(out.Bytes(), &resp); err != nil || resp.ID != 7 || resp.Error == nil || resp.Error.Code != c.code {
				t.Fatalf("answer %s (%v), want id 7 and error %d", out.String(), err, c.code)
			}
		})
	}
}
