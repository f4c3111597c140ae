package longline

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// FuzzLocatedWriteDecode: where locateContent places a content and the
// envelope without it decodes (decodeLocated) and the content unquotes
// (newContent), encoding/json decodes the whole line too, to the same
// request, and the content located is the string it fills: the walk
// never takes a line the whole decode would refuse or read otherwise.
func FuzzLocatedWriteDecode(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"fs/write_text_file","params":{"sessionId":"s","path":"/r/a","content":"plain"}}`,
		` { "id" : 1 , "method" : "fs/write_text_file" , "params" : { "content" : "a\\\"b\\\\" , "path" : "/r/a" } } ` + "\n",
		`{"id":1,"method":"fs/write_text_file","params":{"content":"x"},"params":{"content":"y"}}`,
		`{"id":1,"method":"fs/write_text_file","params":{"content":"x","Content":"y"}}`,
		`{"id":1,"method":"fs/write_text_file","PARAMS":{"CONTENT":"x"}}`,
		`{"id":1,"method":"fs/write_text_file","params":{"cont\u0065nt":"x","content":"y"}}`,
		`{"id":1,"method":"fs/write_text_file","paramſ":{"content":"x"},"params":{"content":"y"}}`,
		`{"id":1,"method":"fs/write_text_file","params":{"_meta":{"content":"no","a":[1,"]",{"b":"}"}]},"content":"yes"}}`,
		`{"id":1,"method":"fs/write_text_file","params":{"content":"x"}} trailing`,
		`{"id":1,"method":"fs/write_text_file","params":{"content":"x\"}}`,
		`{"id":1,"method":"fs/write_text_file","params":{"content":"x\\"}}`,
		`{"id":1,"method":"fs/write_text_file","params":{"content":"a` + "\n" + `b"}}`,
		`{"id":1,"method":"fs/write_text_file","params":{"path":null,"content":"x","sessionId":"s"},"x":true}`,
		`{"id":1,"method":"fs/write_text_file","params":{"content":"x"},"id":2}`,
		`{"id":1,"method":"fs/write_text_file","params":{"content":"x",}}`,
		`{"id":1,"method":"fs/write_text_file","params":{"content":"\ud800\udc00\u00e9\xff"}}`,
	} {
		f.Add([]byte(s), 16)
	}
	f.Fuzz(func(t *testing.T, line []byte, size int) {
		size = max(16, min(size, 1<<20))
		start, end, found := locateContent(line, nil)
		if !found {
			return
		}
		if start < 0 || end > len(line) || end-start < 2 || line[start] != '"' || line[end-1] != '"' {
			t.Fatalf("located [%d, %d) in %d bytes: no string", start, end, len(line))
		}
		m, ok := decodeLocated(line, start, end)
		if !ok {
			return
		}
		c, err := newContent(m.Params.Content, nil)
		if err != nil {
			return // decoded whole, as before
		}
		var want longRequest
		if err := json.Unmarshal(line, &want); err != nil || string(want.ID) != string(m.ID) || want.Method != m.Method {
			t.Fatalf("envelope decoded id %s method %q, the whole line: %v, id %s method %q", m.ID, m.Method, err, want.ID, want.Method)
		}
		content := want.Params.Content
		want.Params.Content = ""
		a, _ := json.Marshal(want.Params)
		b, _ := json.Marshal(m.Params.WriteTextFileRequest)
		if !bytes.Equal(a, b) {
			t.Fatalf("envelope decoded %s, the whole line %s", b, a)
		}
		if s, _ := decodedChunks(t, c, size); s != content {
			t.Fatalf("located content %q, encoding/json: %q", s, content)
		}
	})
}

// TestLocateContentDeclines: the walk declines what it cannot place for
// certain, so that the whole line is decoded: a key twice, a key with an
// escape or past ASCII, a content that is no string.
func TestLocateContentDeclines(t *testing.T) {
	for _, s := range []string{
		`{"id":1,"params":{"content":"x"},"params":{"content":"y"}}`,
		`{"id":1,"params":{"content":"x","Content":"y"}}`,
		`{"id":1,"params":{"cont\u0065nt":"x","content":"y"}}`,
		`{"id":1,"paramſ":{"content":"x"},"params":{"content":"y"}}`,
		`{"id":1,"params":{"content":5}}`,
		`{"id":1,"params":["content","x"]}`,
		`{"id":1,"params":{"content":"x}}`,
		`{"id":1}`,
	} {
		if start, end, found := locateContent([]byte(s), nil); found {
			t.Errorf("%s: located [%d, %d), want a decline", s, start, end)
		}
	}
	line := `{"id":1,"params":{"_meta":{"content":"no"},"a":["}",{"content":"no"}],"content":"y\\\"es\\\\"},"z":null}`
	start, end, found := locateContent([]byte(line), nil)
	if want := `"y\\\"es\\\\"`; !found || line[start:end] != want {
		t.Fatalf("located %v [%d, %d), want %s", found, start, end, want)
	}
	if !strings.Contains(line[end:], `"z"`) {
		t.Fatal("the walk ended early")
	}
}

// TestLocateContentAcrossWindows: a string longer than the walk's window,
// with escaped quotes and runs of backslashes on the windows' edges, is
// placed exactly, and done is told of each window as it is read.
func TestLocateContentAcrossWindows(t *testing.T) {
	prefix := `{"id":1,"method":"fs/write_text_file","params":{"content":`
	for _, edge := range []int{-2, -1, 0, 1, 2} {
		body := []byte(strings.Repeat("a", 5<<19))
		at := strWindow - len(prefix) - 1 + edge // the content's body starts one past its quote
		copy(body[at-3:], `\\\"`)                // an escaped backslash, then an escaped quote, on the edge
		copy(body[2*strWindow-len(prefix):], `\\`)
		content := `"` + string(body) + `"`
		line := []byte(prefix + content + `,"path":"/r/a"}}`)
		var rests []int
		start, end, found := locateContent(line, func(rest []byte) { rests = append(rests, len(rest)) })
		if !found || string(line[start:end]) != content {
			t.Fatalf("edge %d: located %v [%d, %d), want [%d, %d)", edge, found, start, end, len(prefix), len(prefix)+len(content))
		}
		if len(rests) == 0 || !slices.IsSortedFunc(rests, func(a, b int) int { return b - a }) {
			t.Fatalf("edge %d: done told %v, want each window read, in order", edge, rests)
		}
		var want string
		must(t, json.Unmarshal([]byte(content), &want))
		c, err := newContent(line[start:end], nil)
		must(t, err)
		if got, _ := decodedChunks(t, c, 64<<10); got != want {
			t.Fatalf("edge %d: the located content decodes otherwise than encoding/json's", edge)
		}
	}
}
