package longline

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
)

// longMessage is a long request of method whose id comes after a content
// of size bytes, so the id is only known once the whole line was read.
func longMessage(method string, id, size int) io.Reader {
	return io.MultiReader(strings.NewReader(`{"jsonrpc":"2.0","method":"`+method+`","params":{"sessionId":"s","path":"/r/a","content":"`),
		io.LimitReader(repeatByte('x'), int64(size)),
		strings.NewReader(`"},"id":`+strconv.Itoa(id)+"}\n"))
}

// repeatByte reads as an endless run of c.
type repeatByte byte

func (r repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

// readAgent runs the custodian's reader of the agent's output over from,
// under caps, and returns what reached the SDK and the answers written to
// the agent, one per line.
func readAgent(t *testing.T, from io.Reader, caps *Caps) (sdk string, answers []string) {
	t.Helper()
	var out bytes.Buffer
	ll := NewReader(from, &LockedWriter{w: &out}, nil, slog.New(slog.DiscardHandler), caps)
	got, err := io.ReadAll(ll)
	must(t, err)
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		if l != "" {
			answers = append(answers, l)
		}
	}
	return string(got), answers
}

// answerOf decodes one answer: its id, and its error's code and tether code.
func answerOf(t *testing.T, line string) (id int, code int, tether errcode.Code) {
	t.Helper()
	var resp struct {
		ID    int               `json:"id"`
		Error *acp.RequestError `json:"error"`
	}
	if err := json.Unmarshal([]byte(line), &resp); err != nil || resp.Error == nil {
		t.Fatalf("answer %.200s: %v", line, err)
	}
	tc, _ := acperr.CodeOf(resp.Error)
	return resp.ID, resp.Error.Code, tc
}

// testCaps are caps over a fresh spool directory.
func testCaps(t *testing.T, lines int, bytes int64) *Caps {
	return NewCaps(t.TempDir(), lines, bytes)
}

const shortLine = `{"jsonrpc":"2.0","id":1,"method":"x/short"}` + "\n"

// TestAttackLongLinesPastTheSlotsAreBusy: with every long-line slot taken
// (another line in flight), a long request is answered busy with the id
// that comes after its content, nothing of it reaches the SDK, and the
// short line after it does. Positive control: with the slot free the same
// line is served (as a read, refused -32600), and with the caps off too.
func TestAttackLongLinesPastTheSlotsAreBusy(t *testing.T) {
	caps := testCaps(t, 1, DefaultBytes)
	if !caps.takeSlot() {
		t.Fatal("no slot to take")
	}
	sdk, answers := readAgent(t, io.MultiReader(longMessage("fs/read_text_file", 41, 12<<20), strings.NewReader(shortLine)), caps)
	if sdk != shortLine || len(answers) != 1 {
		t.Fatalf("SDK got %.100q, answers %d", sdk, len(answers))
	}
	if id, _, code := answerOf(t, answers[0]); id != 41 || code != errcode.CodeBusy {
		t.Fatalf("answer id %d code %q, want 41 busy", id, code)
	}
	caps.release(0)
	for name, c := range map[string]*Caps{"slot free": caps, "caps off": nil} {
		sdk, answers = readAgent(t, io.MultiReader(longMessage("fs/read_text_file", 42, 12<<20), strings.NewReader(shortLine)), c)
		if sdk != shortLine || len(answers) != 1 {
			t.Fatalf("%s: SDK got %.100q, answers %d", name, sdk, len(answers))
		}
		if id, rpc, code := answerOf(t, answers[0]); id != 42 || rpc != -32600 || code != "" {
			t.Fatalf("%s: answer id %d error %d code %q, want 42 -32600 (served)", name, id, rpc, code)
		}
	}
	if caps.slots != 1 || caps.bytes != caps.total {
		t.Fatalf("after the lines: %d slots, %d of %d bytes free", caps.slots, caps.bytes, caps.total)
	}
}

// TestAttackLongLinesPastTheBytesAreBusy: a whole long line whose charge
// does not fit the bytes free now (other lines hold them) is answered
// busy. Positive control: with the bytes free it is served.
func TestAttackLongLinesPastTheBytesAreBusy(t *testing.T) {
	caps := testCaps(t, 4, 64<<20)
	if !caps.charge(40 << 20) {
		t.Fatal("no bytes to charge")
	}
	_, answers := readAgent(t, longMessage("fs/read_text_file", 5, 12<<20), caps) // charged 24 MiB: 24 free
	if len(answers) != 1 {
		t.Fatalf("answers %d", len(answers))
	}
	if id, _, code := answerOf(t, answers[0]); id != 5 || code != errcode.CodeBusy {
		t.Fatalf("answer id %d code %q, want 5 busy", id, code)
	}
	caps.bytes += 40 << 20 // the other lines end
	_, answers = readAgent(t, longMessage("fs/read_text_file", 6, 12<<20), caps)
	if id, rpc, _ := answerOf(t, answers[0]); id != 6 || rpc != -32600 {
		t.Fatalf("answer id %d error %d, want 6 -32600 (served)", id, rpc)
	}
}

// TestAttackLongLineOverItsBoundIsTooLarge: a line longer than one line's
// bound (half of LongLineBytes) is answered too_large as it passes the
// bound, the rest of it is dropped, the traffic after it flows, the slot
// is given back and no spool file is left. Positive control: under the
// default bound the same line is served.
func TestAttackLongLineOverItsBoundIsTooLarge(t *testing.T) {
	caps := testCaps(t, 4, 2*(12<<20))
	sdk, answers := readAgent(t, io.MultiReader(longMessage("fs/write_text_file", 9, 20<<20), strings.NewReader(shortLine)), caps)
	if sdk != shortLine || len(answers) != 1 {
		t.Fatalf("SDK got %.100q, answers %d", sdk, len(answers))
	}
	if id, _, code := answerOf(t, answers[0]); id != 9 || code != errcode.CodeTooLarge {
		t.Fatalf("answer id %d code %q, want 9 too_large", id, code)
	}
	if caps.slots != 4 || caps.bytes != caps.total {
		t.Fatalf("after the line: %d slots, %d of %d bytes free", caps.slots, caps.bytes, caps.total)
	}
	if left, _ := os.ReadDir(caps.dir); len(left) != 0 {
		t.Fatalf("spool left %d files", len(left))
	}
	_, answers = readAgent(t, longMessage("fs/write_text_file", 11, SDKLineMax), testCaps(t, 4, 2<<20)) // ends within the first read
	if id, _, code := answerOf(t, answers[0]); id != 11 || code != errcode.CodeTooLarge {
		t.Fatalf("answer id %d code %q, want 11 too_large", id, code)
	}
	_, answers = readAgent(t, longMessage("fs/read_text_file", 10, 20<<20), testCaps(t, 4, DefaultBytes))
	if id, rpc, _ := answerOf(t, answers[0]); id != 10 || rpc != -32600 {
		t.Fatalf("answer id %d error %d, want 10 -32600 (served)", id, rpc)
	}
}

// TestLongLineRefusedNotification: a refused long message that is no
// request (no id) is dropped without an answer, and what follows flows.
func TestLongLineRefusedNotification(t *testing.T) {
	caps := testCaps(t, 0, DefaultBytes) // no slot at all
	line := `{"jsonrpc":"2.0","method":"x/note","params":{"content":"` + strings.Repeat("y", 11<<20) + `"}}` + "\n"
	sdk, answers := readAgent(t, strings.NewReader(line+shortLine), caps)
	if sdk != shortLine || len(answers) != 0 {
		t.Fatalf("SDK got %.100q, answers %q", sdk, answers)
	}
}
