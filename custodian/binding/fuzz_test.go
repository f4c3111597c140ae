package binding

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
)

// FuzzAttachParams: `_tether/attach` params either decode strictly into
// a session id and a valid digest, or are refused with a tether code.
func FuzzAttachParams(f *testing.F) {
	f.Add([]byte(`{"session_id":"s","tuple_sha256":"` + strings.Repeat("a", 64) + `"}`))
	f.Add([]byte(`{"session_id":"s","tuple_sha256":"` + strings.Repeat("a", 64) + `","principal":"mallory"}`))
	f.Add([]byte(`{"session_id":"","tuple_sha256":"x"} {}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := parseAttach(data)
		if err != nil {
			if _, ok := acperr.CodeOf(err); !ok {
				t.Fatalf("refusal without a tether code: %v", err)
			}
			return
		}
		if req.SessionID == "" || !acpmeta.ValidDigest(req.TupleSHA256) {
			t.Fatalf("accepted %+v", req)
		}
		again, err := parseAttach(mustJSON(t, req))
		if err != nil || again != req {
			t.Fatalf("re-encoded params do not round trip: %+v %v", again, err)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
