package custodian

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/fixtures/etcdtest"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// fleetHelperEnv makes the test binary a fleet custodian process
// (fleetHelper): the custodian library on the etcd op store, serving ACP
// on stdin/stdout, reporting its claims on fd 3.
const fleetHelperEnv = "TETHER_CUSTODIAN_FLEET_HELPER"

// fleetConfig is what a fleet custodian process is handed.
type fleetConfig struct {
	State     string          `json:"state"`
	Key       string          `json:"key"`
	Sock      string          `json:"sock"`
	Tuple     admission.Tuple `json:"tuple"`
	Session   string          `json:"session"`
	Endpoints []string        `json:"endpoints"`
	Prefix    string          `json:"prefix"`
	Name      string          `json:"name"`
	LeaseTTL  time.Duration   `json:"lease_ttl"`
	// Standby: take the session over (TakeOver: wait out the owner's
	// lease) before binding it.
	Standby bool `json:"standby"`
	// StopIn, StopAt, StopNth: SIGSTOP this process at the StopNth time
	// the step StopAt of a StopIn call is reached (a frozen owner).
	StopIn  string `json:"stop_in"`
	StopAt  string `json:"stop_at"`
	StopNth int64  `json:"stop_nth"`
}

// fleetHelper is the fleet custodian process. It prints "waiting" (a
// standby connected to etcd, about to wait for the owner's lease), "claimed
// TOKEN N" (its takeover: N keys interrupted) and "bound TOKEN" on fd 3,
// then serves the agent until its stdin closes.
func fleetHelper() int {
	var fc fleetConfig
	status := os.NewFile(3, "status")
	fail := func(what string, err error) int { fmt.Fprintf(status, "error %s: %v\n", what, err); return 3 }
	if err := json.Unmarshal([]byte(os.Getenv("TETHER_CUSTODIAN_FLEET_CONFIG")), &fc); err != nil {
		return fail("config", err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: fc.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fail("etcd", err)
	}
	ctx := context.Background()
	store, err := opstore.OpenEtcd(ctx, opstore.EtcdOptions{Client: cli, Prefix: fc.Prefix, Name: fc.Name, LeaseTTL: fc.LeaseTTL})
	if err != nil {
		return fail("open store", err)
	}
	c, err := New(Options{StateDir: fc.State, AuditKey: []byte(fc.Key), Fleet: store})
	if err != nil {
		return fail("custodian", err)
	}
	var seen atomic.Int64
	c.hook = func(_ context.Context, method, step string) {
		if method == fc.StopIn && step == fc.StopAt && seen.Add(1) == fc.StopNth {
			stopHere()
		}
	}
	if fc.Standby {
		fmt.Fprintln(status, "waiting")
		cl, err := c.TakeOver(ctx, fc.Session)
		if err != nil {
			return fail("take over", err)
		}
		fmt.Fprintf(status, "claimed %d %d\n", cl.Token, len(cl.Interrupted))
	}
	recv := NewReceiver(StreamDialer(transport.Unix{Path: fc.Sock, HostOnly: true}.Dial, wireclient.ClientConfig{}), Backoff{}, nil)
	conn := c.Serve(os.Stdout, os.Stdin, ConnOptions{})
	b := Binding{Tuple: fc.Tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: fc.Tuple.Owner, Receiver: recv}
	if _, err := conn.Initialize(ctx); err != nil {
		return fail("initialize", err)
	}
	if err := loadRetrying(ctx, conn, acp.LoadSessionRequest{SessionId: acp.SessionId(fc.Session), Cwd: fc.Tuple.Root,
		McpServers: []acp.McpServer{}}, b); err != nil {
		return fail("bind", err)
	}
	tok, _ := store.Token(fc.Session)
	fmt.Fprintf(status, "bound %d\n", tok)
	<-conn.Done()
	conn.Close()
	recv.Close()
	c.Close()
	store.Close()
	cli.Close()
	return 0
}

// loadRetrying binds the session, again while the op store answers
// unavailable (an etcd member restarting: the bind recorded nothing and
// is safe to repeat), for at most a minute.
func loadRetrying(ctx context.Context, conn *Conn, req acp.LoadSessionRequest, b Binding) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err := conn.LoadSession(ctx, req, b)
		if err == nil {
			return nil
		}
		if code, _ := acperr.CodeOf(err); !errors.Is(err, opstore.ErrUnavailable) && code != errcode.CodeUnavailable {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stopHere freezes the process (SIGSTOP) before this goroutine goes on.
// The signal goes to this very thread (tgkill), which stops on its way
// out of the call: a SIGSTOP sent to the process could be taken by
// another thread while this one runs on and sends its request.
func stopHere() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}

// fleetAgent is the agent side of a fleet custodian's ACP connection: it
// answers session/load by attaching, as the plugin does.
type fleetAgent struct {
	acp.Agent // nil: any other method panics, failing the test
	conn      *acp.AgentSideConnection
	digest    string
}

func (a *fleetAgent) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber,
		AgentCapabilities: acp.AgentCapabilities{LoadSession: true}}, nil
}

func (a *fleetAgent) LoadSession(ctx context.Context, req acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	_, err := a.conn.CallExtension(ctx, acpmeta.MethodAttach, acpmeta.AttachRequest{SessionID: string(req.SessionId), TupleSHA256: a.digest})
	return acp.LoadSessionResponse{}, err
}

func (a *fleetAgent) Cancel(context.Context, acp.CancelNotification) error { return nil }

// fleetProc is one fleet custodian process and the test's agent side.
type fleetProc struct {
	cmd    *exec.Cmd
	agent  *fleetAgent
	stdin  io.Closer
	status chan string
	fc     fleetConfig
	exited chan struct{}
}

// newFleetConfig is a config for a custodian of sess on rr, under a
// fresh etcd prefix shared by every copy of it.
func newFleetConfig(t testing.TB, c *etcdtest.Cluster, rr *realReceiver, tuple admission.Tuple, sess string) fleetConfig {
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	return fleetConfig{Key: skey, Sock: rr.sock, Tuple: tuple, Session: sess, Endpoints: c.Endpoints(),
		Prefix: fmt.Sprintf("/fleet-test/%d/", time.Now().UnixNano()), LeaseTTL: 2 * time.Second}
}

// startFleet starts a fleet custodian process named name (its own state
// directory) and its agent side; it does not wait for the bind.
func startFleet(t testing.TB, fc fleetConfig, name string) *fleetProc {
	t.Helper()
	fc.Name, fc.State = name, t.TempDir()+"/state"
	cfg, _ := json.Marshal(fc)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fleetHelperEnv+"=1", "TETHER_CUSTODIAN_FLEET_CONFIG="+string(cfg))
	cmd.Stderr = os.Stderr
	statusR, statusW, err := os.Pipe()
	must(t, err)
	cmd.ExtraFiles = []*os.File{statusW}
	toC, err := cmd.StdinPipe()
	must(t, err)
	fromC, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	statusW.Close()
	p := &fleetProc{cmd: cmd, stdin: toC, status: make(chan string, 16), fc: fc, exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(statusR)
		for sc.Scan() {
			p.status <- sc.Text()
		}
		close(p.status)
	}()
	go func() { cmd.Wait(); close(p.exited) }()
	p.agent = &fleetAgent{digest: fc.Tuple.SHA256()}
	g := &testagent.Gate{R: fromC, Ready: make(chan struct{})}
	p.agent.conn = acp.NewAgentSideConnection(p.agent, toC, g)
	p.agent.conn.SetLogger(slog.New(slog.DiscardHandler))
	close(g.Ready)
	t.Cleanup(func() {
		syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// next returns the process's next status line ("waiting", "claimed ...",
// "bound ...", "error ..."), failing the test after within.
func (p *fleetProc) next(t testing.TB, within time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-p.status:
		if !ok {
			t.Fatalf("fleet custodian %s exited without a status line", p.fc.Name)
		}
		if strings.HasPrefix(l, "error ") {
			t.Fatalf("fleet custodian %s: %s", p.fc.Name, l)
		}
		return l
	case <-time.After(within):
		t.Fatalf("fleet custodian %s said nothing within %s", p.fc.Name, within)
	}
	return ""
}

// waiting waits until a standby is connected to etcd and about to wait
// for the owner's lease.
func (p *fleetProc) waiting(t testing.TB) {
	t.Helper()
	if l := p.next(t, time.Minute); l != "waiting" {
		t.Fatalf("fleet custodian %s: %q, want waiting", p.fc.Name, l)
	}
}

// bound waits for the bind and returns the fencing token.
func (p *fleetProc) bound(t testing.TB) uint64 {
	t.Helper()
	l := p.next(t, time.Minute)
	for l == "waiting" || strings.HasPrefix(l, "claimed ") {
		l = p.next(t, time.Minute)
	}
	tok, err := strconv.ParseUint(strings.TrimPrefix(l, "bound "), 10, 64)
	if err != nil || tok == 0 {
		t.Fatalf("fleet custodian %s: %q, want bound TOKEN", p.fc.Name, l)
	}
	return tok
}

// kill SIGKILLs the process and waits for it.
func (p *fleetProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

func (p *fleetProc) meta(key string) map[string]any {
	return acpmeta.Op{TupleSHA256: p.fc.Tuple.SHA256(), OpKey: key, Deadline: time.Now().Add(time.Minute)}.Meta()
}

// create sends terminal/create of /bin/sh -c script keyed KEY:create.
func (p *fleetProc) create(ctx context.Context, key, script string) (acp.CreateTerminalResponse, error) {
	return p.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: acp.SessionId(p.fc.Session),
		Command: "/bin/sh", Args: []string{"-c", script}, Cwd: &p.fc.Tuple.Root, Meta: p.meta(key + ":create")})
}

// exec runs script to its exit: create, wait_for_exit, release, each
// keyed from key. It returns the exit code.
func (p *fleetProc) exec(ctx context.Context, key, script string) (int, error) {
	t, err := p.create(ctx, key, script)
	if err != nil {
		return -1, err
	}
	sid := acp.SessionId(p.fc.Session)
	w, err := p.agent.conn.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid, TerminalId: t.TerminalId,
		Meta: p.meta(key + ":wait")})
	if err != nil {
		return -1, err
	}
	if _, err := p.agent.conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid, TerminalId: t.TerminalId,
		Meta: p.meta(key + ":release")}); err != nil {
		return -1, err
	}
	if w.ExitCode == nil {
		return -1, fmt.Errorf("no exit code: %+v", w)
	}
	return *w.ExitCode, nil
}

// execAnswers runs script as exec does, with terminal/output before the
// release, and returns each answer's JSON (create, wait, output,
// release) and the first error (the answers up to it).
func (p *fleetProc) execAnswers(ctx context.Context, key, script string) ([]string, error) {
	var answers []string
	keep := func(v any) {
		b, _ := json.Marshal(v)
		answers = append(answers, string(b))
	}
	t, err := p.create(ctx, key, script)
	if err != nil {
		return answers, err
	}
	keep(t)
	sid := acp.SessionId(p.fc.Session)
	w, err := p.agent.conn.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid, TerminalId: t.TerminalId,
		Meta: p.meta(key + ":wait")})
	if err != nil {
		return answers, err
	}
	keep(w)
	o, err := p.agent.conn.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: sid, TerminalId: t.TerminalId,
		Meta: p.meta(key + ":output")})
	if err != nil {
		return answers, err
	}
	keep(o)
	r, err := p.agent.conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid, TerminalId: t.TerminalId,
		Meta: p.meta(key + ":release")})
	if err != nil {
		return answers, err
	}
	keep(r)
	return answers, nil
}

// processState returns the state letter of pid in /proc (R, S, T, ...).
func processState(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// waitState waits until pid is in state (bounded).
func waitState(t testing.TB, pid int, state string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for processState(pid) != state {
		if time.Now().After(deadline) {
			t.Fatalf("process %d never reached state %s (%s)", pid, state, processState(pid))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
