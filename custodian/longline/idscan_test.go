package longline

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// scanLine runs an idScanner over line in pieces of step bytes.
func scanLine(line string, step int) *idScanner {
	var sc idScanner
	for b := []byte(line); len(b) > 0; {
		n := min(step, len(b))
		sc.Write(b[:n])
		b = b[n:]
	}
	return &sc
}

// TestIDScanner: the id of a request is found wherever it stands, through
// escapes and nesting, in pieces of any size; what is no request yields
// none.
func TestIDScanner(t *testing.T) {
	big := strings.Repeat(`x\"\\`, 1000)
	cases := []struct{ line, id string }{
		{`{"jsonrpc":"2.0","id":7,"method":"m","params":{"content":"` + big + `"}}`, `7`},
		{`{"jsonrpc":"2.0","method":"m","params":{"content":"` + big + `","id":9},"id":"a\"b"}`, `"a\"b"`},
		{` { "ID" : -1.5e3 , "Method" : "m" } `, `-1.5e3`},
		{`{"\u0069d":3,"method":"m"}`, `3`},
		{`{"id":1,"id":2,"method":"m"}`, `2`},
		{`{"id":1,"method":"m","id":null}`, ``},
		{`{"id":{"a":1},"method":"m"}`, ``},
		{`{"id":[1],"method":"m"}`, ``},
		{`{"id":true,"method":"m"}`, ``},
		{`{"id":7,"params":{"method":"m"}}`, ``},                             // a response: no method at the top
		{`{"method":"m","params":{"id":7}}`, ``},                             // a notification
		{`[{"id":7,"method":"m"}]`, ``},                                      // not an object
		{`{"id":7,"method":"m","params":{"content":"cut`, ``},                // the line ends inside
		{`{"id":"` + strings.Repeat("i", maxScanID) + `","method":"m"}`, ``}, // id too long
		{`{"id":7,"method":"m"} trailing {"id":8}`, `7`},
	}
	for _, c := range cases {
		for _, step := range []int{1, 3, 4096} {
			sc := scanLine(c.line+"\n"+`{"id":99,"method":"after the newline"}`, step)
			if !sc.ended() {
				t.Fatalf("%.60s: the newline was not seen", c.line)
			}
			if got := string(sc.id()); got != c.id {
				t.Fatalf("%.60s (pieces of %d): id %q, want %q", c.line, step, got, c.id)
			}
		}
	}
}

// TestIDScannerMethod: the method's value is kept when it is a string,
// the last one winning.
func TestIDScannerMethod(t *testing.T) {
	for line, want := range map[string]string{
		`{"id":1,"method":"fs/write_text_file","params":{"method":"x"}}`: "fs/write_text_file",
		`{"method":"a\u0062","id":1}`:                                    "ab",
		`{"method":"a","METHOD":{"b":1}}`:                                "",
		`{"method":7}`:                                                   "",
	} {
		if got := scanLine(line+"\n", 2).methodName(); got != want {
			t.Errorf("%s: method %q, want %q", line, got, want)
		}
	}
}

// FuzzIDScanner: on every line that encoding/json decodes as an object,
// the scanner finds the id encoding/json finds (a number or string of at
// most maxScanID bytes, of a message with a method), whatever the
// pieces the line comes in; on any other line it must not panic.
func FuzzIDScanner(f *testing.F) {
	for _, s := range []string{`{"jsonrpc":"2.0","id":7,"method":"fs/write_text_file","params":{"content":"a\nb"}}`,
		`{"ID":"x","METHOD":1}`, `{"\u0069\u0064":1,"method":0}`, `{"id":1,"id":{},"method":"m"}`, `[1]`, `{"a":[{"id":1}],"method":"m","id":2}`} {
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, line string, step int) {
		if strings.Contains(line, "\n") {
			return
		}
		sc := scanLine(line+"\n", max(1, step%64+1))
		if !sc.ended() {
			t.Fatal("the newline was not seen")
		}
		var want struct {
			ID     json.RawMessage `json:"id"`
			Method json.RawMessage `json:"method"`
		}
		if json.Unmarshal([]byte(line), &want) != nil || !strings.HasPrefix(strings.TrimLeft(line, " \t\r"), "{") {
			return
		}
		wantID := []byte(want.ID)
		if len(want.Method) == 0 || len(wantID) > maxScanID || !validID(wantID) {
			wantID = nil
		}
		if got := sc.id(); !bytes.Equal(got, wantID) {
			t.Fatalf("id %q, encoding/json's %q (method %q)", got, wantID, want.Method)
		}
		var wantName string
		if len(want.Method) <= maxScanID && bytes.HasPrefix(want.Method, []byte(`"`)) {
			must(t, json.Unmarshal(want.Method, &wantName))
		}
		if got := sc.methodName(); got != wantName {
			t.Fatalf("method %q, encoding/json's %q", got, wantName)
		}
	})
}
