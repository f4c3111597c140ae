package custodian

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
)

// genText is about n bytes of numbered UTF-8 lines (the last one cut
// before n, on a character boundary).
func genText(n int) []byte {
	var b bytes.Buffer
	for i := 1; b.Len() < n; i++ {
		fmt.Fprintf(&b, "line %07d of a generated file: ä€ ok\n", i)
	}
	out := b.Bytes()[:n]
	for !utf8.Valid(out) {
		out = out[:len(out)-1]
	}
	return out
}

func (la *liveAgent) writeFile(path string, content []byte, meta map[string]any) (acp.WriteTextFileResponse, error) {
	if meta == nil {
		meta = la.op()
	}
	return la.agent.conn.WriteTextFile(context.Background(), acp.WriteTextFileRequest{SessionId: la.sid(),
		Path: filepath.Join(la.rr.tuple.Root, path), Content: string(content), Meta: meta})
}

func (la *liveAgent) readFile(path string, line, limit *int) (acp.ReadTextFileResponse, error) {
	return la.agent.conn.ReadTextFile(context.Background(), acp.ReadTextFileRequest{SessionId: la.sid(),
		Path: filepath.Join(la.rr.tuple.Root, path), Line: line, Limit: limit, Meta: la.op()})
}

// receiptOf returns the receipt stored under op key key.
func (la *liveAgent) receiptOf(key string) *opstore.Receipt {
	la.t.Helper()
	rs, err := la.c.store.List()
	must(la.t, err)
	for _, r := range rs {
		if r.OpKey == key {
			return r
		}
	}
	la.t.Fatalf("no receipt for op key %s", key)
	return nil
}

// TestIntegrationChunkedFileThroughCustodian: a 3 MiB file (several
// frames) written by an agent through the custodian and a real receiver
// is byte-identical on disk with a verified receipt; a retry with the same
// key and content answers the original receipt without writing again;
// read_text_file gives it back whole, and line/limit select as ACP says,
// also deep inside a file that only chunks can carry.
func TestIntegrationChunkedFileThroughCustodian(t *testing.T) {
	la := newLiveAgent(t)
	content := genText(3 << 20)
	tag := la.op()
	resp, err := la.writeFile("big.txt", content, tag)
	must(t, err)
	got, err := os.ReadFile(la.rr.file("big.txt"))
	must(t, err)
	if !bytes.Equal(got, content) {
		t.Fatalf("file on disk: %d bytes, want the %d written", len(got), len(content))
	}
	key := tag["tether/op"].(acpmeta.Op).OpKey
	if r := la.receiptOf(key); r.Outcome != opstore.Verified || r.Files[0].Actual != sha256Hex(content) {
		t.Fatalf("receipt = %+v", r)
	}
	must(t, os.WriteFile(la.rr.file("big.txt"), []byte("changed since\n"), 0o644))
	again, err := la.writeFile("big.txt", content, tag)
	must(t, err)
	if mustJSON(again) != mustJSON(resp) {
		t.Fatalf("retry answered %s, want the original %s", mustJSON(again), mustJSON(resp))
	}
	if got, _ := os.ReadFile(la.rr.file("big.txt")); string(got) != "changed since\n" {
		t.Fatalf("the retry wrote again: %d bytes", len(got))
	}
	_, err = la.writeFile("big.txt", content, nil)
	must(t, err)
	whole, err := la.readFile("big.txt", nil, nil)
	must(t, err)
	if whole.Content != string(content) {
		t.Fatalf("read back %d bytes, want %d identical", len(whole.Content), len(content))
	}
	if f, _, _ := acpmeta.FileFromMeta(whole.Meta); f.SHA256 != sha256Hex(content) || f.Size != int64(len(content)) {
		t.Fatalf("read meta %+v", whole.Meta)
	}
	lines := strings.SplitAfter(string(content), "\n")
	for _, c := range []struct{ line, limit int }{{50_000, 3}, {2, 1}, {len(lines) - 1, 0}, {len(lines) + 5, 2}} {
		part, err := la.readFile("big.txt", &c.line, &c.limit)
		must(t, err)
		want := strings.Join(lines[min(c.line-1, len(lines)):min(c.line-1+c.limit, len(lines))], "")
		if c.limit == 0 {
			want = strings.Join(lines[c.line-1:], "")
		}
		if part.Content != want {
			t.Fatalf("line %d limit %d: %q, want %q", c.line, c.limit, part.Content, want)
		}
	}
	from := 10
	tail, err := la.readFile("big.txt", &from, nil) // most of the file: chunked
	must(t, err)
	if tail.Content != strings.Join(lines[9:], "") {
		t.Fatalf("from line 10: %d bytes", len(tail.Content))
	}
}

// TestIntegrationChunkedWriteOverBound: content over the grant's
// max_file_bytes (64 MiB here) is refused too_large, and nothing is
// written.
func TestIntegrationChunkedWriteOverBound(t *testing.T) {
	la := newLiveAgent(t)
	content := bytes.Repeat([]byte("x"), 64<<20+1)
	_, err := la.writeFile("huge.txt", content, nil)
	wantCode(t, err, errcode.CodeTooLarge)
	if _, err := os.Stat(la.rr.file("huge.txt")); !os.IsNotExist(err) {
		t.Fatalf("huge.txt: %v", err)
	}
}

// TestIntegrationLongAgentLine: a write_text_file whose JSON-RPC line is
// longer than acp-go-sdk's 10 MiB bound (12 MiB of content) is served
// through the custodian's own line reader, and the connection still
// serves later calls.
func TestIntegrationLongAgentLine(t *testing.T) {
	la := newLiveAgent(t)
	content := genText(12 << 20)
	_, err := la.writeFile("long.txt", content, nil)
	must(t, err)
	got, err := os.ReadFile(la.rr.file("long.txt"))
	must(t, err)
	if !bytes.Equal(got, content) {
		t.Fatalf("file on disk: %d bytes", len(got))
	}
	one := 1
	head, err := la.readFile("long.txt", &one, &one)
	must(t, err)
	if head.Content != strings.SplitAfter(string(content), "\n")[0] {
		t.Fatalf("first line after a long message: %q", head.Content)
	}
}

// TestIntegrationLongReadReceiptCountsItsAnswer: a read whose answer no
// receipt can keep (a 3 MiB file, read in chunks) is not encoded for its
// receipt, yet the receipt names the answer's exact length as json.Marshal
// of the answer measures it (escapes included), and a retry is refused
// too_large with that note.
func TestIntegrationLongReadReceiptCountsItsAnswer(t *testing.T) {
	la := newLiveAgent(t)
	content := strings.Repeat("<a & b>\n\u2028é\"", 200<<10) // 3.2 MiB, longer still in JSON
	_, err := la.writeFile("long.txt", []byte(content), nil)
	must(t, err)
	tag := la.op()
	req := acp.ReadTextFileRequest{SessionId: la.sid(), Path: filepath.Join(la.rr.tuple.Root, "long.txt"), Meta: tag}
	first, err := la.agent.conn.ReadTextFile(context.Background(), req)
	must(t, err)
	if first.Content != content {
		t.Fatalf("read %d bytes, want %d", len(first.Content), len(content))
	}
	a, err := json.Marshal(first)
	must(t, err)
	r := la.receiptOf(tag["tether/op"].(acpmeta.Op).OpKey)
	want := fmt.Sprintf(noteAnswerNotKept, len(a))
	if r.Response != nil || r.Note != want || r.Error == nil || r.Error.Code != string(errcode.CodeTooLarge) {
		t.Fatalf("receipt %+v: want no response, note %q", r, want)
	}
	_, err = la.agent.conn.ReadTextFile(context.Background(), req)
	wantCode(t, err, errcode.CodeTooLarge)
}
