package custodian

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/testagent"
)

// liveSession is an in-process custodian bound, through the foreign test
// agent (custodian/internal/testagent), to a real receiver process.
type liveSession struct {
	rr      *realReceiver
	c       *Custodian
	conn    *Conn
	sid     acp.SessionId
	mu      sync.Mutex
	updates []string
}

func newLiveSession(t *testing.T) *liveSession {
	t.Helper()
	rr := startReceiver(t)
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	c, err := New(Options{StateDir: filepath.Join(t.TempDir(), "state"), AuditKey: []byte(skey)})
	must(t, err)
	recv := NewReceiver(rr.dialer(), Backoff{}, nil)
	ls := &liveSession{rr: rr, c: c}
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	testagent.Serve(a2cW, c2aR, "sess-live")
	ls.conn = c.Serve(c2aW, a2cR, ConnOptions{OnUpdate: ls.onUpdate})
	t.Cleanup(func() {
		c2aW.Close()
		a2cW.Close()
		ls.conn.Close()
		recv.Close()
		if err := c.Close(); err != nil {
			t.Errorf("custodian Close: %v", err)
		}
	})
	ctx := context.Background()
	_, err = ls.conn.Initialize(ctx)
	must(t, err)
	resp, err := ls.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: rr.tuple.Root, McpServers: []acp.McpServer{}},
		Binding{Tuple: rr.tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: "alice", Receiver: recv})
	must(t, err)
	ls.sid = resp.SessionId
	return ls
}

func (ls *liveSession) onUpdate(_ context.Context, n acp.SessionNotification) error {
	if n.Update.AgentMessageChunk != nil && n.Update.AgentMessageChunk.Content.Text != nil {
		ls.mu.Lock()
		ls.updates = append(ls.updates, n.Update.AgentMessageChunk.Content.Text.Text)
		ls.mu.Unlock()
	}
	return nil
}

// prompt sends lines as one prompt and returns the agent's result lines.
func (ls *liveSession) prompt(t *testing.T, lines ...string) []string {
	t.Helper()
	ls.mu.Lock()
	ls.updates = nil
	ls.mu.Unlock()
	text := strings.ReplaceAll(strings.Join(lines, "\n"), "ROOT", ls.rr.tuple.Root)
	resp, err := ls.conn.Prompt(context.Background(), acp.PromptRequest{SessionId: ls.sid, Prompt: []acp.ContentBlock{acp.TextBlock(text)}})
	must(t, err)
	if resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("stop reason %s", resp.StopReason)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return append([]string(nil), ls.updates...)
}

func TestIntegrationEndToEnd(t *testing.T) {
	ls := newLiveSession(t)
	got := ls.prompt(t, "write ROOT/hello.txt hi there", "read ROOT/hello.txt", "exec id -u")
	if len(got) != 3 || !strings.HasPrefix(got[0], "ok write") || !strings.Contains(got[1], `"hi there\n"`) ||
		!strings.Contains(got[2], sprintf(`exit=0 output="%d\n"`, grantUID)) {
		t.Fatalf("results %q", got)
	}
	fi, err := os.Stat(ls.rr.file("hello.txt"))
	must(t, err)
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != grantUID || st.Gid != grantGID {
		t.Fatalf("written file owned by %d:%d, want the grant's %d:%d", st.Uid, st.Gid, grantUID, grantGID)
	}
	rs := receiptsOf(t, ls.c)
	if rs["verified"] < 1 || rs["needs_review"] < 1 {
		t.Fatalf("receipt outcomes %v: want a verified write and a needs_review exec", rs)
	}
}

// TestIntegrationForeignAgentRefusals: an ACP agent that is not the
// plugin calls fs/terminal methods for an unbound session, without the op
// tag, with another tuple's digest, and outside the root; each gets its
// code and nothing happens in the computer.
func TestIntegrationForeignAgentRefusals(t *testing.T) {
	ls := newLiveSession(t)
	got := ls.prompt(t,
		"session=someone-else write ROOT/unbound.txt x",
		"write /etc/tether-escape.txt x",
		"write ROOT/../escape.txt x",
		"nometa write ROOT/nometa.txt x",
		"wrongtuple exec touch ROOT/wrongtuple",
		"write ROOT/after-fence.txt x",
	)
	want := []string{"error not_admitted", "error path_escape", "error path_escape",
		"error tuple_mismatch", "error tuple_mismatch", "error fenced"}
	if len(got) != len(want) {
		t.Fatalf("results %q", got)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("call %d: %q, want %s", i, got[i], want[i])
		}
	}
	for _, f := range []string{"unbound.txt", "nometa.txt", "wrongtuple", "after-fence.txt", "../escape.txt"} {
		if _, err := os.Lstat(ls.rr.file(f)); err == nil {
			t.Errorf("%s exists: a refused call had a side effect", f)
		}
	}
	if _, err := os.Lstat("/etc/tether-escape.txt"); err == nil {
		t.Error("/etc/tether-escape.txt exists on the host")
	}
}

func receiptsOf(t *testing.T, c *Custodian) map[string]int {
	t.Helper()
	rs, err := c.store.List()
	must(t, err)
	out := map[string]int{}
	for _, r := range rs {
		out[string(r.Outcome)]++
	}
	return out
}
