package custodian

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
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

// TestConfigLongLinesAndAuditBudget: the caps and the audit budget are
// read from the config file; below -1, or a byte cap under twice the
// SDK's line bound, is refused.
func TestConfigLongLinesAndAuditBudget(t *testing.T) {
	base := `{"tuple":{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/w1"},
"lease_not_after":"2030-01-01T00:00:00Z","principal":"alice","state_dir":"state","audit_key_file":"audit.key",
"receiver":{"kind":"unix","path":"r.sock","host_only":true}%s}`
	c, err := ParseConfig([]byte(sprintf(base, `,"long_lines":2,"long_line_bytes":134217728,"audit_budget":-1`)), "/etc/tether")
	must(t, err)
	if c.LongLines != 2 || c.LongLineBytes != 128<<20 || c.AuditBudget != -1 {
		t.Fatalf("config: long_lines %d, long_line_bytes %d, audit_budget %d", c.LongLines, c.LongLineBytes, c.AuditBudget)
	}
	for _, bad := range []string{`,"long_lines":-2`, `,"long_line_bytes":-1`, `,"long_line_bytes":1048576`, `,"audit_budget":-2`} {
		if _, err := ParseConfig([]byte(sprintf(base, bad)), "/etc/tether"); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", bad, err)
		}
	}
}

// TestLongLineRefusalsAreAudited: a refused long message is counted in
// its connection's refusals record (no session id: the message was not
// decoded), with its code and method.
func TestLongLineRefusalsAreAudited(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.LongLineBytes = 2 * (12 << 20) })
	var out bytes.Buffer
	conn := h.c.Serve(&out, longMessage(acp.ClientMethodFsWriteTextFile, 3, 20<<20), ConnOptions{})
	<-conn.Done()
	must(t, conn.Close())
	if _, _, code := answerOf(t, strings.TrimSpace(out.String())); code != errcode.CodeTooLarge {
		t.Fatalf("answer %.200s, want too_large", out.String())
	}
	for _, r := range auditLog(t, h) {
		if n, ok := r.Refusals[string(errcode.CodeTooLarge)]; ok && r.SessionID == "" {
			if n.Count != 1 || n.First.Method != acp.ClientMethodFsWriteTextFile {
				t.Fatalf("too_large refusals %+v", n)
			}
			return
		}
	}
	t.Fatal("no refusals record counts the too_large message")
}
