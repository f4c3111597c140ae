package longline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/errcode"
)

// decodedChunks is c's content as Chunks gives it through a buffer of
// size bytes, and the chunks' lengths.
func decodedChunks(t *testing.T, c *Content, size int) (string, []int) {
	t.Helper()
	var b bytes.Buffer
	var lens []int
	err := c.Chunks(make([]byte, 0, size), func(p []byte) error {
		if len(p) == 0 || len(p) > max(size, 16) {
			t.Fatalf("chunk of %d bytes through a buffer of %d", len(p), size)
		}
		lens = append(lens, len(p))
		b.Write(p)
		return nil
	})
	must(t, err)
	return b.String(), lens
}

// FuzzLongWriteDecode: a long write decoded with its content left in the
// line (decodeRawLong) is the request encoding/json decodes from the same
// line, its content's length, SHA-256 and bytes (through buffers of any
// size) those of the string encoding/json decodes; where encoding/json
// reports anything, the raw path declines, so the line is decoded as
// before.
func FuzzLongWriteDecode(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"fs/write_text_file","params":{"sessionId":"s","path":"/r/a","content":"plain"}}`,
		`{"id":"x","method":"fs/write_text_file","params":{"path":"/r/a","content":"a\"b\\c\/d\b\f\n\r\t\u00e9\u2028\ud83d\ude00\ud800x\udc00\u0000"}}`,
		`{"id":2,"method":"fs/write_text_file","params":{"content":"\xff\xe2\x80é日本"}}`,
		`{"id":3,"method":"fs/write_text_file","params":{"Content":"x","content":"y","CONTENT":"z"}}`,
		`{"id":4,"method":"fs/write_text_file","params":{"content":5}}`,
		`{"id":5,"method":"fs/write_text_file","params":{"content":null}}`,
		`{"id":6,"method":"fs/write_text_file","params":{"path":7,"content":"x"}}`,
		`{"id":7,"method":"fs/write_text_file","params":{"content":"x\u12"}}`,
		`{"id":8,"method":"fs/write_text_file","params":{"_meta":{"tether/op":{"op_key":"k"}},"content":"x"}}`,
		`{"id":9,"method":"fs/read_text_file","params":{"content":"x"}}`,
	} {
		f.Add([]byte(s), 16)
	}
	f.Fuzz(func(t *testing.T, line []byte, size int) {
		size = max(16, min(size, 1<<20))
		var want longRequest
		werr := json.Unmarshal(line, &want)
		got, ok := decodeRawLong(line, nil)
		if !ok {
			return // decoded as before
		}
		if werr != nil || len(want.ID) == 0 || want.Method != acp.ClientMethodFsWriteTextFile {
			t.Fatalf("raw path took a line encoding/json reports %v (id %s, method %q)", werr, want.ID, want.Method)
		}
		content := want.Params.Content
		want.Params.Content = ""
		a, _ := json.Marshal(want.Params)
		b, _ := json.Marshal(got.Params)
		if string(want.ID) != string(got.ID) || want.Method != got.Method || !bytes.Equal(a, b) {
			t.Fatalf("raw path decoded %s %s %s, encoding/json %s %s %s", got.ID, got.Method, b, want.ID, want.Method, a)
		}
		sum := sha256.Sum256([]byte(content))
		if got.content.Len() != int64(len(content)) || got.content.SHA256() != hex.EncodeToString(sum[:]) {
			t.Fatalf("content: %d bytes, sha %s; encoding/json decoded %d bytes %x", got.content.Len(), got.content.SHA256(), len(content), sum)
		}
		if s, _ := decodedChunks(t, got.content, size); s != content {
			t.Fatalf("chunks through %d bytes: %q, encoding/json: %q", size, s, content)
		}
	})
}

// TestContentChunksAreFullButTheLast: a long content comes in chunks as
// long as the buffer allows, less at most one character's room, the last
// one shorter; together they are the content.
func TestContentChunksAreFullButTheLast(t *testing.T) {
	content := strings.Repeat("ab\u00e9\n\"", 50000)
	raw, _ := json.Marshal(content)
	c, err := newContent(raw, nil)
	must(t, err)
	got, lens := decodedChunks(t, c, 64<<10)
	if got != content {
		t.Fatal("chunks are not the content")
	}
	for i, n := range lens[:len(lens)-1] {
		if n < 64<<10-8 {
			t.Fatalf("chunk %d of %d bytes: not full", i, n)
		}
	}
}

// writeServer records the long writes served with their content left in
// the line.
type writeServer struct {
	readServer
	mu   sync.Mutex
	got  []string
	errs []error
}

func (s *writeServer) WriteTextFileContent(_ context.Context, p acp.WriteTextFileRequest, c *Content) (acp.WriteTextFileResponse, error) {
	var b strings.Builder
	err := c.Chunks(make([]byte, 0, 1<<20), func(p []byte) error { b.Write(p); return nil })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, p.Path+":"+b.String())
	s.errs = append(s.errs, err)
	return acp.WriteTextFileResponse{}, nil
}

func (s *writeServer) WriteTextFile(_ context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, "whole "+p.Path+":"+p.Content)
	return acp.WriteTextFileResponse{}, nil
}

func (s *writeServer) Decoded(string)                      {}
func (s *writeServer) Refused(code errcode.Code, m string) { s.t.Errorf("refused %s %s", code, m) }

// TestLongWriteServedFromItsLine: a long write, spooled under caps, is
// served with its content decoded from the line (escapes and all) and
// answered; one whose content is not a string is decoded as before and
// refused invalid params, as the SDK would.
func TestLongWriteServedFromItsLine(t *testing.T) {
	content := strings.Repeat("x\\n\\u00e9\\\"", SDKLineMax/10+1)
	lines := `{"jsonrpc":"2.0","id":1,"method":"fs/write_text_file","params":{"sessionId":"s","path":"/r/a","content":"` + content + `"}}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"fs/write_text_file","params":{"sessionId":"s","path":"/r/b","content":[` + strings.Repeat(`1,`, SDKLineMax/2) + `1]}}` + "\n"
	s := &writeServer{readServer: readServer{t: t}}
	var out bytes.Buffer
	ll := NewReader(strings.NewReader(lines), NewLockedWriter(&out), s, slog.New(slog.DiscardHandler), testCaps(t, 4, 256<<20))
	got, err := io.ReadAll(ll)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("%d bytes reached the SDK", len(got))
	}
	want := "/r/a:" + strings.Repeat("x\né\"", SDKLineMax/10+1)
	if len(s.got) != 1 || s.got[0] != want || errors.Join(s.errs...) != nil {
		t.Fatalf("served %d writes (%v), want the one at /r/a with its content decoded", len(s.got), s.errs)
	}
	answers := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(answers) != 2 || !strings.Contains(out.String(), `"id":1,"jsonrpc":"2.0","result":{}`) {
		t.Fatalf("answers %.300q", answers)
	}
	refused := answers[0]
	if strings.Contains(refused, `"result"`) {
		refused = answers[1]
	}
	if id, code, _ := answerOf(t, refused); id != 2 || code != -32602 {
		t.Fatalf("the write of a non-string content: answered id %d code %d, want invalid params (-32602)", id, code)
	}
}
