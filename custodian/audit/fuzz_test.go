package audit

import (
	"bytes"
	"testing"
)

func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`{"seq":0,"time":"2026-01-01T00:00:00Z","kind":"bind","session_id":"s"}`))
	f.Add([]byte(`{"seq":1,"kind":"result","sizes":{"output":3},"exit_code":0}`))
	f.Add([]byte(`{"seq":1,"kind":"nope"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRecord(data)
		if err != nil {
			return
		}
		enc, err := r.encode()
		if err != nil {
			t.Fatalf("decoded record does not re-encode: %v", err)
		}
		if bytes.IndexByte(enc, '\n') >= 0 {
			t.Fatal("encoded record contains a newline")
		}
		if _, err := DecodeRecord(enc); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
	})
}

func FuzzSplitLog(f *testing.F) {
	f.Add([]byte("a\nb\n"))
	f.Add([]byte("a\nb"))
	f.Add([]byte("\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, complete, err := SplitLog(data)
		if complete < 0 || complete > len(data) {
			t.Fatalf("complete %d outside [0,%d]", complete, len(data))
		}
		if err != nil {
			return
		}
		n := 0
		for _, r := range recs {
			if len(r) == 0 || bytes.IndexByte(r, '\n') >= 0 {
				t.Fatalf("bad record %q", r)
			}
			n += len(r) + 1
		}
		if n != complete {
			t.Fatalf("records cover %d bytes, complete says %d", n, complete)
		}
	})
}

func FuzzOpenCheckpoint(f *testing.F) {
	k := newKeys(f, "tether.test/audit")
	good, err := SignCheckpoint(Checkpoint{Origin: k.s.Name(), Size: 3}, k.s)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("tether.test/audit\n3\nAAAA\n\n— x y\n"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		c, err := OpenCheckpoint(msg, k.v)
		if err != nil {
			return
		}
		if c.Origin != k.v.Name() || c.Size < 0 {
			t.Fatalf("accepted checkpoint %+v", c)
		}
	})
}
