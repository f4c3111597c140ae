package ctl

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// TestDecodeCopyRequests: a copy chunk is 1..MaxCopyChunk bytes and
// goes with copy_in_data alone; a path goes with the begin ops alone and
// copy_out_begin needs one.
func TestDecodeCopyRequests(t *testing.T) {
	full := base64.StdEncoding.EncodeToString(make([]byte, MaxCopyChunk))
	for _, line := range []string{
		`{"op":"copy_in_begin"}`, `{"op":"copy_in_begin","path":"work/x"}`,
		`{"op":"copy_in_data","data":"eA=="}`, `{"op":"copy_in_data","data":"` + full + `"}`,
		`{"op":"copy_in_end"}`, `{"op":"copy_out_begin","path":"f.txt"}`, `{"op":"copy_out_data"}`, `{"op":"copy_abort"}`,
	} {
		if _, err := DecodeRequest([]byte(line)); err != nil {
			t.Errorf("%.80s: %v", line, err)
		}
	}
	over := base64.StdEncoding.EncodeToString(make([]byte, MaxCopyChunk+1))
	for name, line := range map[string]string{
		"empty chunk":           `{"op":"copy_in_data"}`,
		"chunk over the cap":    `{"op":"copy_in_data","data":"` + over + `"}`,
		"data with copy_end":    `{"op":"copy_in_end","data":"eA=="}`,
		"data with out_data":    `{"op":"copy_out_data","data":"eA=="}`,
		"out without a path":    `{"op":"copy_out_begin"}`,
		"path with data op":     `{"op":"copy_in_data","data":"eA==","path":"x"}`,
		"path with abort":       `{"op":"copy_abort","path":"x"}`,
		"NUL in the path":       `{"op":"copy_out_begin","path":"a\u0000b"}`,
		"path over the cap":     `{"op":"copy_in_begin","path":"` + strings.Repeat("a", MaxCopyPath+1) + `"}`,
		"port with a copy op":   `{"op":"copy_abort","port":1}`,
		"unknown field":         `{"op":"copy_abort","chunk":1}`,
		"an op outside the set": `{"op":"copy_everything"}`,
	} {
		if _, err := DecodeRequest([]byte(line)); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
}

// TestCopyChunk: what a guest may answer to copy_out_data, and what it
// may not (positive controls: a full chunk, a done with files).
func TestCopyChunk(t *testing.T) {
	if c, done, _, err := CopyChunk(Response{Data: make([]byte, MaxCopyChunk)}); err != nil || done || len(c) != MaxCopyChunk {
		t.Fatalf("a full chunk: %d %v %v", len(c), done, err)
	}
	if _, done, files, err := CopyChunk(Response{Done: true, Files: 3}); err != nil || !done || files != 3 {
		t.Fatalf("done: %v %d %v", done, files, err)
	}
	for name, r := range map[string]Response{
		"chunk over the cap": {Data: make([]byte, MaxCopyChunk+1)},
		"empty, not done":    {},
		"done with data":     {Done: true, Data: []byte("x")},
		"negative files":     {Done: true, Files: -1},
		"files before done":  {Data: []byte("x"), Files: 1},
		"an error answer":    {Error: "no"},
	} {
		if _, _, _, err := CopyChunk(r); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
}

// FuzzCopyChunk: whatever line a guest sends as its answer to
// copy_out_data, the host takes at most MaxCopyChunk bytes and never a
// negative count, and never both a chunk and the end.
func FuzzCopyChunk(f *testing.F) {
	f.Add([]byte(`{"data":"AP8="}`))
	f.Add([]byte(`{"done":true,"files":2}`))
	f.Add([]byte(`{"done":true,"data":"eA=="}`))
	f.Add([]byte(`{"error":"no","refused":"unsafe_entry"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := DecodeResponse(line)
		if err != nil {
			return
		}
		c, done, files, err := CopyChunk(r)
		if err != nil {
			return
		}
		if len(c) > MaxCopyChunk || files < 0 || done == (len(c) > 0) || !bytes.Equal(c, r.Data) {
			t.Fatalf("took %d bytes, done %v, files %d from %q", len(c), done, files, line)
		}
	})
}
