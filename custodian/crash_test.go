package custodian

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
)

const helperEnv = "TETHER_CUSTODIAN_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(custodianHelper())
	}
	slog.SetDefault(slog.New(slog.DiscardHandler)) // acp-go-sdk's connection diagnostics
	code := m.Run()
	realrecv.Cleanup()
	os.Exit(code)
}

// helperConfig is what the crash test hands a custodian process.
type helperConfig struct {
	State   string          `json:"state"`
	Key     string          `json:"key"`
	Sock    string          `json:"sock"`
	Tuple   admission.Tuple `json:"tuple"`
	CrashAt string          `json:"crash_at"`
}

// custodianHelper is a custodian process serving ACP on stdin/stdout; it
// SIGKILLs itself at the configured step of a keyed dispatch.
func custodianHelper() int {
	var hc helperConfig
	if err := json.Unmarshal([]byte(os.Getenv("TETHER_CUSTODIAN_TEST_CONFIG")), &hc); err != nil {
		return 2
	}
	c, err := New(Options{StateDir: hc.State, AuditKey: []byte(hc.Key)})
	if err != nil {
		os.Stderr.WriteString("helper: " + err.Error() + "\n")
		return 3
	}
	c.hook = func(step string) {
		if step == hc.CrashAt {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	recv := NewReceiver(StreamDialer(transport.Unix{Path: hc.Sock, HostOnly: true}.Dial, wire.ClientConfig{}), Backoff{}, nil)
	conn := c.Serve(os.Stdout, os.Stdin, ConnOptions{})
	ctx := context.Background()
	b := Binding{Tuple: hc.Tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: hc.Tuple.Owner, Receiver: recv}
	if _, err := conn.Initialize(ctx); err == nil {
		_, err = conn.NewSession(ctx, acp.NewSessionRequest{Cwd: hc.Tuple.Root, McpServers: []acp.McpServer{}}, b)
		if err != nil {
			os.Stderr.WriteString("helper: bind: " + err.Error() + "\n")
		}
	}
	<-conn.Done()
	conn.Close()
	recv.Close()
	if err := c.Close(); err != nil {
		return 4
	}
	return 0
}

// custodianProc is one custodian process and the agent side of its ACP
// connection (a foreign agent: the test's, written with acp-go-sdk).
type custodianProc struct {
	cmd   *exec.Cmd
	agent *testAgent
	stdin io.Closer
}

func spawnCustodian(t *testing.T, hc helperConfig) *custodianProc {
	t.Helper()
	cfg, _ := json.Marshal(hc)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=1", "TETHER_CUSTODIAN_TEST_CONFIG="+string(cfg))
	cmd.Stderr = os.Stderr
	toC, err := cmd.StdinPipe()
	must(t, err)
	fromC, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	p := &custodianProc{cmd: cmd, stdin: toC}
	p.agent = &testAgent{sessionID: "sess-crash", attachOnNew: true, bound: make(chan struct{})}
	g := &testagent.Gate{R: fromC, Ready: make(chan struct{})}
	p.agent.conn = acp.NewAgentSideConnection(p.agent, toC, g)
	p.agent.conn.SetLogger(slog.New(slog.DiscardHandler))
	close(g.Ready)
	select {
	case <-p.agent.bound:
	case <-time.After(20 * time.Second):
		t.Fatal("custodian process never bound the session")
	}
	if p.agent.attachErr != nil {
		t.Fatalf("attach: %v", p.agent.attachErr)
	}
	return p
}

// stop closes the custodian's stdin and waits for it to exit.
func (p *custodianProc) stop() error {
	p.stdin.Close()
	return p.cmd.Wait()
}

// TestIntegrationCrashAtEachStep SIGKILLs a custodian process at each step
// of a keyed exec (before its intent is durable, after it, after the
// request reached the receiver, after the result) and retries the same
// request, same op key, on a restarted custodian. The child appends one
// line to a file; there is never more than one line, and the retry gets
// the answer the step implies.
func TestIntegrationCrashAtEachStep(t *testing.T) {
	rr := startReceiver(t)
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	cases := []struct {
		step  string
		lines int
		retry string // code of the retry, "" for success
	}{
		{"before-intent", 1, ""},           // nothing recorded, nothing sent: the retry runs it
		{"after-intent", 0, "interrupted"}, // durable but never sent: never run
		{"after-send", 1, "interrupted"},   // ran, result lost: never run again
		{"after-result", 1, "any"},         // ran; the receipt or interrupted
	}
	for i, tc := range cases {
		t.Run(tc.step, func(t *testing.T) {
			hc := helperConfig{State: filepath.Join(t.TempDir(), "state"), Key: skey, Sock: rr.sock, Tuple: rr.tuple, CrashAt: tc.step}
			lines := "lines-" + tc.step
			req := acp.CreateTerminalRequest{SessionId: "sess-crash", Command: "/bin/sh",
				Args: []string{"-c", "echo once >> " + lines}, Cwd: &rr.tuple.Root,
				Meta: acpmeta.Op{TupleSHA256: rr.tuple.SHA256(), OpKey: "crash-" + string(rune('a'+i)), Deadline: time.Now().Add(time.Minute)}.Meta()}

			p := spawnCustodian(t, hc)
			_, err := p.agent.conn.CreateTerminal(context.Background(), req)
			if err == nil {
				t.Fatalf("the custodian survived step %s", tc.step)
			}
			werr := p.cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("custodian exit %v, want SIGKILL at %s", werr, tc.step)
			}

			hc.CrashAt = ""
			p = spawnCustodian(t, hc)
			resp, err := p.agent.conn.CreateTerminal(context.Background(), req)
			code, _ := acpmeta.CodeOf(err)
			switch tc.retry {
			case "":
				if err != nil || resp.TerminalId == "" {
					t.Fatalf("retry after %s: %v, want a new run", tc.step, err)
				}
			case "any":
				if err != nil && code != "interrupted" {
					t.Fatalf("retry after %s: %v, want the receipt or interrupted", tc.step, err)
				}
			default:
				if string(code) != tc.retry {
					t.Fatalf("retry after %s: %v, want %s", tc.step, err, tc.retry)
				}
			}
			time.Sleep(300 * time.Millisecond) // let a started child finish
			if err := p.stop(); err != nil {
				t.Fatalf("custodian exit: %v", err)
			}
			data, _ := os.ReadFile(rr.file(lines))
			if n := strings.Count(string(data), "once\n"); n != tc.lines {
				t.Fatalf("after SIGKILL at %s and a retry the child ran %d times, want %d", tc.step, n, tc.lines)
			}
		})
	}
}
