package qmpinput

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeGreeting: the greeting decoder never panics, and what it
// accepts is a complete, non-negative version from a single JSON object.
func FuzzDecodeGreeting(f *testing.F) {
	f.Add([]byte(greeting72))
	f.Add([]byte(`{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7+deb12u18"}, "capabilities": ["oob"]}}` + "\r\n"))
	f.Add([]byte(`{"QMP": {"version": {"qemu": {"micro": 0, "minor": 0, "major": 7}}}}`))
	f.Add([]byte(`{"QMP": null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, line []byte) {
		g, err := DecodeGreeting(line)
		if err != nil {
			return
		}
		if g.Version.Major < 0 || g.Version.Minor < 0 || g.Version.Micro < 0 || len(g.Capabilities) > maxCapabilities {
			t.Fatalf("accepted %+v", g)
		}
		var v map[string]json.RawMessage
		if json.Unmarshal(line, &v) != nil || len(v) != 1 || v["QMP"] == nil {
			t.Fatalf("accepted a line that is not one {\"QMP\":...} object: %q", line)
		}
	})
}

// FuzzDecodeMessage: the message decoder never panics and classifies
// every accepted line as exactly one of return, error and event.
func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(`{"return": {}, "id": 3}`))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "x"}, "id": 4}`))
	f.Add([]byte(`{"event": "SHUTDOWN", "data": {"guest": true}, "timestamp": {"seconds": 1, "microseconds": 2}}`))
	f.Add([]byte(`{"return": {}, "error": {"class": "a", "desc": "b"}}`))
	f.Add([]byte(`{"return": [1,2], "id": -1}`))
	f.Add([]byte(`{"event": "", "timestamp": {"seconds": 1}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := DecodeMessage(line)
		if err != nil {
			return
		}
		kinds := 0
		if m.Event != "" {
			kinds++
		}
		if m.Error != nil {
			kinds++
		}
		if m.Return != nil {
			kinds++
		}
		if kinds != 1 {
			t.Fatalf("%q decoded to %d kinds: %+v", line, kinds, m)
		}
		if m.Error != nil && m.Error.Class == "" {
			t.Fatalf("%q: error without class", line)
		}
		if m.IsEvent() && m.HasID {
			t.Fatalf("%q: event with an id", line)
		}
	})
}
