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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wireclient"
)

const helperEnv = "TETHER_CUSTODIAN_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(custodianHelper())
	}
	if os.Getenv(fleetHelperEnv) == "1" {
		os.Exit(fleetHelper())
	}
	if os.Getenv(memHelperEnv) == "1" {
		os.Exit(memHelper())
	}
	if os.Getenv(benchCustodianEnv) == "1" {
		os.Exit(benchProcCustodian())
	}
	slog.SetDefault(slog.New(slog.DiscardHandler)) // acp-go-sdk's connection diagnostics
	grantUID, grantGID = realrecv.GrantIDs()
	code := m.Run()
	realrecv.Cleanup()
	if memHelperDir != "" {
		os.RemoveAll(memHelperDir)
	}
	os.Exit(code)
}

// helperConfig is what the crash test hands a custodian process.
type helperConfig struct {
	State   string          `json:"state"`
	Key     string          `json:"key"`
	Sock    string          `json:"sock"`
	Tuple   admission.Tuple `json:"tuple"`
	CrashAt string          `json:"crash_at"`
	// CrashIn is the method whose step CrashAt kills the process.
	CrashIn string `json:"crash_in"`
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
	c.hook = func(_ context.Context, method, step string) {
		if method == hc.CrashIn && step == hc.CrashAt {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	recv := NewReceiver(StreamDialer(transport.Unix{Path: hc.Sock, HostOnly: true}.Dial, wireclient.ClientConfig{}), Backoff{}, nil)
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
			hc := helperConfig{State: filepath.Join(t.TempDir(), "state"), Key: skey, Sock: rr.sock, Tuple: rr.tuple,
				CrashAt: tc.step, CrashIn: acp.ClientMethodTerminalCreate}
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
			code, _ := acperr.CodeOf(err)
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
			// The receiver may start the first custodian's command after
			// the retry was answered (it was sent, not yet served): wait
			// for the lines the step implies, then for every child to end,
			// and only then count. A command run twice shows as one more.
			count := func() int {
				data, _ := os.ReadFile(rr.file(lines))
				return strings.Count(string(data), "once\n")
			}
			for deadline := time.Now().Add(30 * time.Second); count() < tc.lines && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond) // a bound for a slow machine, not a wait
			}
			realrecv.WaitChildrenGone(t)
			if err := p.stop(); err != nil {
				t.Fatalf("custodian exit: %v", err)
			}
			if n := count(); n != tc.lines {
				t.Fatalf("after SIGKILL at %s and a retry the child ran %d times, want %d", tc.step, n, tc.lines)
			}
		})
	}
}

// TestIntegrationCrashAtEachStepOfRelease SIGKILLs a custodian process at
// each step of a terminal/release (which spends no durable write: a
// release repeated changes nothing) and retries the create and the release,
// same op keys, on a restarted custodian. The child writes its pid once
// and sleeps: it never runs twice, the release retry is refused not_found
// without reaching the receiver (terminals do not outlive the process that
// started them), and the child is gone exactly when the release reached
// the receiver before the crash.
func TestIntegrationCrashAtEachStepOfRelease(t *testing.T) {
	rr := startReceiver(t)
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	for i, step := range []string{"before-intent", "after-intent", "after-send", "after-result"} {
		t.Run(step, func(t *testing.T) {
			hc := helperConfig{State: filepath.Join(t.TempDir(), "state"), Key: skey, Sock: rr.sock, Tuple: rr.tuple,
				CrashAt: step, CrashIn: acp.ClientMethodTerminalRelease}
			lines := "pids-" + step
			op := func(key string) map[string]any {
				return acpmeta.Op{TupleSHA256: rr.tuple.SHA256(), OpKey: "rel-" + string(rune('a'+i)) + "-" + key,
					Deadline: time.Now().Add(time.Minute)}.Meta()
			}
			create := acp.CreateTerminalRequest{SessionId: "sess-crash", Command: "/bin/sh",
				Args: []string{"-c", "echo $$ >> " + lines + "; exec /bin/sleep 60"}, Cwd: &rr.tuple.Root, Meta: op("create")}
			p := spawnCustodian(t, hc)
			term, err := p.agent.conn.CreateTerminal(context.Background(), create)
			must(t, err)
			pid := waitPid(t, rr.file(lines))
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			release := acp.ReleaseTerminalRequest{SessionId: "sess-crash", TerminalId: term.TerminalId, Meta: op("release")}
			if _, err := p.agent.conn.ReleaseTerminal(context.Background(), release); err == nil {
				t.Fatalf("the custodian survived step %s of the release", step)
			}
			wantSIGKILL(t, p.cmd.Wait(), step)
			if step == "after-intent" {
				rs, err := opstore.ReadOnly(filepath.Join(hc.State, OpKeysDir))
				must(t, err)
				for _, r := range rs {
					if r.Method == acp.ClientMethodTerminalRelease {
						t.Fatalf("a release claimed just before the crash left a durable record %+v; it must spend no durable write", r)
					}
				}
			}

			hc.CrashAt = ""
			p = spawnCustodian(t, hc)
			_, err = p.agent.conn.ReleaseTerminal(context.Background(), release)
			if code, _ := acperr.CodeOf(err); code != errcode.CodeNotFound {
				t.Fatalf("release retry after a crash at %s: %v, want not_found (an earlier process's terminal)", step, err)
			}
			again, err := p.agent.conn.CreateTerminal(context.Background(), create)
			if code, _ := acperr.CodeOf(err); err != nil && code != errcode.CodeInterrupted || err == nil && again.TerminalId != term.TerminalId {
				t.Fatalf("create retry: %v %v, want its receipt replayed (%s) or interrupted, never a new run", again.TerminalId, err, term.TerminalId)
			}
			must(t, p.stop())
			data, _ := os.ReadFile(rr.file(lines))
			if n := strings.Count(string(data), "\n"); n != 1 {
				t.Fatalf("the child ran %d times, want 1", n)
			}
			sent := step == "after-send" || step == "after-result"
			if alive := syscall.Kill(pid, 0) == nil; alive == sent {
				t.Fatalf("crash at %s: child alive=%v; want it killed exactly when the release reached the receiver", step, alive)
			}
		})
	}
}

// waitPid waits for the child to write its pid into file.
func waitPid(t *testing.T, file string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(file)
		if s := strings.TrimSpace(string(data)); strings.HasSuffix(string(data), "\n") {
			pid, err := strconv.Atoi(s)
			must(t, err)
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child never wrote its pid to %s", file)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wantSIGKILL(t *testing.T, werr error, step string) {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("custodian exit %v, want SIGKILL at %s", werr, step)
	}
}

// TestIntegrationCrashMidTransfer SIGKILLs a custodian process after the
// first chunk of a chunked write reached the receiver. The old file stays
// as it was, nothing staged is left beside it (the receiver drops the
// transfer when the connection ends), and the retry with the same op key
// on a restarted custodian is answered interrupted without running.
func TestIntegrationCrashMidTransfer(t *testing.T) {
	rr := startReceiver(t)
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	must(t, os.WriteFile(rr.file("data.txt"), []byte("old content\n"), 0o644))
	hc := helperConfig{State: filepath.Join(t.TempDir(), "state"), Key: skey, Sock: rr.sock, Tuple: rr.tuple,
		CrashAt: "after-first-chunk", CrashIn: acp.ClientMethodFsWriteTextFile}
	req := acp.WriteTextFileRequest{SessionId: "sess-crash", Path: filepath.Join(rr.tuple.Root, "data.txt"),
		Content: strings.Repeat("new line of a large file\n", 120_000), // 3 MB: four chunks
		Meta:    acpmeta.Op{TupleSHA256: rr.tuple.SHA256(), OpKey: "crash-transfer", Deadline: time.Now().Add(time.Minute)}.Meta()}
	p := spawnCustodian(t, hc)
	if _, err := p.agent.conn.WriteTextFile(context.Background(), req); err == nil {
		t.Fatal("the custodian survived its first chunk")
	}
	wantSIGKILL(t, p.cmd.Wait(), "after-first-chunk")
	hc.CrashAt = ""
	p = spawnCustodian(t, hc)
	_, err = p.agent.conn.WriteTextFile(context.Background(), req)
	if code, _ := acperr.CodeOf(err); code != errcode.CodeInterrupted {
		t.Fatalf("retry after a broken transfer: %v, want interrupted", err)
	}
	must(t, p.stop())
	if got, _ := os.ReadFile(rr.file("data.txt")); string(got) != "old content\n" {
		t.Fatalf("data.txt = %d bytes after a broken transfer, want the old content", len(got))
	}
	ents, err := os.ReadDir(rr.tuple.Root)
	must(t, err)
	for _, e := range ents {
		if e.Name() != "data.txt" {
			t.Fatalf("left beside it: %s", e.Name())
		}
	}
}
