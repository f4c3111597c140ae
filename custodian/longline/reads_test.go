package longline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
)

// quoted is writeQuoted's output for s.
func quoted(s string) string {
	var b bytes.Buffer
	w := bufio.NewWriterSize(&b, 16) // small: the content crosses many flushes
	if err := writeQuoted(w, s); err != nil {
		panic(err)
	}
	w.Flush()
	return b.String()
}

// FuzzWriteQuoted: a string streamed by writeQuoted is byte for byte what
// json.Marshal writes for it, valid UTF-8 or not.
func FuzzWriteQuoted(f *testing.F) {
	for _, s := range []string{"", "plain", "a\"b\\c", "<a href='x'>&amp;</a>", "\x00\x01\x1f\x7f\b\f\n\r\t",
		"\u2028\u2029", "é日本\U0001F600", "\xff\xfe", "\xe2\x80", "a\xe2\x80\xa8b", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := quoted(s); got != string(want) {
			t.Fatalf("writeQuoted(%q) = %s, json.Marshal = %s", s, got, want)
		}
	})
}

// sdkAnswer is the line acp-go-sdk's handleInbound and sendMessage write
// for a read answered resp to a request of id.
func sdkAnswer(t *testing.T, id json.RawMessage, resp acp.ReadTextFileResponse) []byte {
	t.Helper()
	result, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(outbound{JSONRPC: "2.0", ID: &id, Result: result})
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// FuzzReadAnswer: the whole answer line of a read, streamed, is the SDK's
// line byte for byte, for any id the agent sent, any content and meta.
func FuzzReadAnswer(f *testing.F) {
	f.Add(`1`, "hello\n", "0f00", int64(6))
	f.Add(`"raw-1"`, "", "", int64(0))
	f.Add(` "a<b" `, "<script>\u2028", "ab", int64(-1))
	f.Add(`[1, {"x" : null}]`, "\xff", "\"", int64(1<<40))
	f.Fuzz(func(t *testing.T, id, content, sum string, size int64) {
		if !json.Valid([]byte(id)) {
			return
		}
		var meta map[string]any
		if sum != "" {
			meta = map[string]any{"tether/file": map[string]any{"sha256": sum, "size": size}}
		}
		resp := acp.ReadTextFileResponse{Content: content, Meta: meta}
		want := sdkAnswer(t, json.RawMessage(id), resp)
		raw := json.RawMessage(id)
		cid, err := json.Marshal(&raw)
		if err != nil {
			t.Fatal(err)
		}
		head, err := readResultHead(&resp)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		w := bufio.NewWriterSize(&b, 16)
		if err := writeReadAnswer(w, cid, head, quotedString(content)); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		if !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("streamed answer\n%s\nSDK's\n%s", b.Bytes(), want)
		}
		n, err := ReadResultLen(&resp, nil)
		if result, _ := json.Marshal(resp); err != nil || n != int64(len(result)) {
			t.Fatalf("ReadResultLen = %d, %v; json.Marshal is %d bytes", n, err, len(result))
		}
	})
}

// readServer answers reads by path; it fails the test on anything else.
type readServer struct {
	t     *testing.T
	mu    sync.Mutex
	reads int
}

func (s *readServer) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	s.t.Error("unexpected write")
	return acp.WriteTextFileResponse{}, errors.New("unexpected")
}

func (s *readServer) WriteTextFileContent(context.Context, acp.WriteTextFileRequest, *Content) (acp.WriteTextFileResponse, error) {
	s.t.Error("unexpected write")
	return acp.WriteTextFileResponse{}, errors.New("unexpected")
}

func (s *readServer) Refused(errcode.Code, string) { s.t.Error("unexpected refusal") }
func (s *readServer) Decoded(string)               { s.t.Error("unexpected long line") }

// ReadTextFile answers by path: a content, a tether refusal, a plain
// error, a cancellation, a meta that does not encode.
func (s *readServer) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, *FileContent, error) {
	resp, err := s.read(ctx, p)
	return resp, nil, err
}

func (s *readServer) read(_ context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	s.mu.Lock()
	s.reads++
	s.mu.Unlock()
	switch p.Path {
	case "/r/refused":
		return acp.ReadTextFileResponse{}, acperr.NewError(errcode.CodeTupleMismatch, "tuple %s", "<x>")
	case "/r/plain":
		return acp.ReadTextFileResponse{}, errors.New("plain failure")
	case "/r/cancelled":
		return acp.ReadTextFileResponse{}, fmt.Errorf("stopped: %w", context.Canceled)
	case "/r/badmeta":
		return acp.ReadTextFileResponse{Content: "x", Meta: map[string]any{"f": func() {}}}, nil
	case "/r/nometa":
		return acp.ReadTextFileResponse{Content: "a\u2028<b>\n"}, nil
	}
	return acp.ReadTextFileResponse{Content: "content of " + p.Path + " \"q\" é\n",
		Meta: map[string]any{"tether/file": map[string]any{"sha256": "ab", "size": 3}}}, nil
}

// readClient is the same server as an acp.Client, for the SDK's side.
type readClient struct {
	acp.Client // nil: only reads are sent
	s          *readServer
}

func (c readClient) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return c.s.read(ctx, p)
}

// readLines are reads as agents may send them: each one answered, or
// refused, by the SDK in its own way.
var readLines = []string{
	`{"jsonrpc":"2.0","id":1,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/a"}}`,
	`{"jsonrpc":"2.0","id":"raw-<2>","method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/b","line":2,"limit":1}}`,
	`{ "id" : [3, {"k": "v"}] , "method" : "fs/read_text_file", "params" : {"sessionId":"s","path":"/r/nometa"} }`,
	`{"jsonrpc":"2.0","id":4,"method":"fs/read_text_file","params":{"sessionId":"s","path":""}}`,
	`{"jsonrpc":"2.0","id":5,"method":"fs/read_text_file","params":[1]}`,
	`{"jsonrpc":"2.0","id":6,"method":"fs/read_text_file"}`,
	`{"jsonrpc":"2.0","id":7,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/refused"}}`,
	`{"jsonrpc":"2.0","id":8,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/plain"}}`,
	`{"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/cancelled"}}`,
	`{"jsonrpc":"2.0","id":10,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/badmeta"}}`,
	`{"jsonrpc":"2.0","id":11,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/crlf"}}` + "\r",
	`{"jsonrpc":"2.0","ID":12,"Method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/case"}}`,
}

// TestReadsAnsweredAsTheSDKAnswers: every read served beside the SDK is
// answered with the line the SDK itself writes for it, byte for byte
// (errors, invalid params and a refusal's data included). Positive
// control: the SDK's side is a real acp.ClientSideConnection over the
// same client, so a difference in either would show.
func TestReadsAnsweredAsTheSDKAnswers(t *testing.T) {
	for _, line := range readLines {
		ours := answerLine(t, line, func(in io.Reader, out io.Writer, s *readServer) {
			ll := NewReader(in, NewLockedWriter(out), s, slog.New(slog.DiscardHandler), nil)
			if got, _ := io.ReadAll(ll); len(got) != 0 {
				t.Errorf("%s reached the SDK: %q", line, got)
			}
		})
		sdk := answerLine(t, line, func(in io.Reader, out io.Writer, s *readServer) {
			c := acp.NewClientSideConnection(readClient{s: s}, out, in) // its logger: the default, set by no one here
			<-c.Done()
		})
		if ours != sdk {
			t.Errorf("request %s\nanswered %s\nthe SDK: %s", line, ours, sdk)
		}
		if ours == "" {
			t.Errorf("request %s: no answer", line)
		}
	}
}

// answerLine feeds line to serve and returns the one answer written.
func answerLine(t *testing.T, line string, serve func(in io.Reader, out io.Writer, s *readServer)) string {
	t.Helper()
	inR, inW := io.Pipe()
	var out lockedBuffer
	s := &readServer{t: t}
	done := make(chan struct{})
	go func() { defer close(done); serve(inR, &out, s) }()
	if _, err := io.WriteString(inW, line+"\n"); err != nil {
		t.Fatal(err)
	}
	out.waitLine(t)
	inW.Close()
	<-done
	return strings.TrimSuffix(out.String(), "\n")
}

// lockedBuffer is a buffer written by one goroutine and read by another;
// waitLine returns once it holds a whole line.
type lockedBuffer struct {
	mu   sync.Mutex
	b    bytes.Buffer
	line chan struct{}
	once sync.Once
}

func (l *lockedBuffer) init() { l.once.Do(func() { l.line = make(chan struct{}) }) }

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.init()
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.b.Write(p)
	if bytes.IndexByte(p, '\n') >= 0 {
		select {
		case <-l.line:
		default:
			close(l.line)
		}
	}
	return n, err
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) waitLine(t *testing.T) {
	t.Helper()
	l.init()
	<-l.line
}

// TestOtherLinesStillReachTheSDK: a line that names fs/read_text_file but
// is no read request (a notification, a response, another method's
// params, an escaped method name) goes on to the SDK unchanged and is not
// served here.
func TestOtherLinesStillReachTheSDK(t *testing.T) {
	lines := `{"jsonrpc":"2.0","method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/a"}}` + "\n" +
		`{"jsonrpc":"2.0","id":1,"result":{"content":"fs/read_text_file"}}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"fs/write_text_file","params":{"sessionId":"s","path":"/r/fs/read_text_file","content":"x"}}` + "\n" +
		`{"jsonrpc":"2.0","id":3,"method":"fs\/read_text_file","params":{"sessionId":"s","path":"/r/a"}}` + "\n" +
		`{"jsonrpc":"2.0","id":null,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/r/a"}}` + "\n" +
		`not json fs/read_text_file` + "\n"
	s := &readServer{t: t}
	var out bytes.Buffer
	ll := NewReader(strings.NewReader(lines), NewLockedWriter(&out), s, slog.New(slog.DiscardHandler), nil)
	got, err := io.ReadAll(ll)
	must(t, err)
	if string(got) != lines || out.Len() != 0 || s.reads != 0 {
		t.Fatalf("to the SDK %q (want every line), answered %q, %d reads served", got, out.String(), s.reads)
	}
	// Positive control: the same reader serves a read request itself.
	read := readLines[0] + "\n"
	ll = NewReader(strings.NewReader(read), NewLockedWriter(&out), s, slog.New(slog.DiscardHandler), nil)
	got, err = io.ReadAll(ll)
	must(t, err)
	if len(got) != 0 || s.reads != 1 || !strings.HasPrefix(out.String(), `{"jsonrpc":"2.0","id":1,"result":`) {
		t.Fatalf("a read: to the SDK %q, answered %q, %d reads served", got, out.String(), s.reads)
	}
}

// FuzzQuotedFile: a content answered from a spool file, read back in
// pieces cut on characters, is the JSON string json.Marshal writes for
// it, and QuotedLen its length.
func FuzzQuotedFile(f *testing.F) {
	f.Add("plain", int64(0))
	f.Add(strings.Repeat("é<\u2028\n", pieceSize/5), int64(3))
	f.Add(strings.Repeat("日本", pieceSize/3+1), int64(1))
	f.Fuzz(func(t *testing.T, content string, off int64) {
		if !utf8.ValidString(content) {
			return // a spooled content was checked to be text
		}
		off = max(0, off%8)
		file, err := os.CreateTemp(t.TempDir(), "spool")
		must(t, err)
		_, err = file.WriteAt([]byte(content), off)
		must(t, err)
		fc := NewFileContent(file, off, int64(len(content)))
		defer fc.Close()
		var b bytes.Buffer
		w := bufio.NewWriterSize(&b, 16)
		must(t, writeQuotedFile(w, fc))
		must(t, w.Flush())
		want, _ := json.Marshal(content)
		n, err := fc.QuotedLen()
		must(t, err)
		if b.String() != string(want) || n != int64(len(want)) {
			t.Fatalf("from the file %d bytes (QuotedLen %d), json.Marshal %d", b.Len(), n, len(want))
		}
	})
}
