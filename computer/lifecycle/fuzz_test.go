package lifecycle

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

func jsonLine(r Record) ([]byte, error) {
	b, err := json.Marshal(r)
	return append(b, '\n'), err
}

// FuzzParseRecord: the parser never panics, and whatever it accepts has a
// hash that matches, and encodes back to a line it parses to the same
// record.
func FuzzParseRecord(f *testing.F) {
	r := Record{Seq: 1, Computer: "c1", Owner: "alice", From: None, To: api.StateQueued,
		At: time.Date(2026, 12, 6, 19, 0, 0, 0, time.UTC), Prev: genesis}
	r.Hash = r.Sum()
	b, _ := json.Marshal(r)
	f.Add(b)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"seq":1,"seq":2}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := ParseRecord(line)
		if err != nil {
			return
		}
		if r.Hash != r.Sum() {
			t.Fatalf("accepted a record whose hash does not match")
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := ParseRecord(b)
		if err != nil {
			t.Fatalf("re-encoded record refused: %v", err)
		}
		if !bytes.Equal(r.Canonical(), r2.Canonical()) {
			t.Fatalf("re-encoding changed the record")
		}
	})
}
