package host_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/plugin/acptest"
	"github.com/tetherdev/tether/plugin/host"
	"github.com/tetherdev/tether/plugin/server"
)

// helperArg makes the test binary act as tether-plugin (the helper-process
// pattern): host.Load runs it with WithArgs(helperArg[, "versions=N,M"]).
const helperArg = "tether-plugin-helper"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == hostHelperArg {
		os.Exit(hostHelper())
	}
	if len(os.Args) > 1 && os.Args[1] == helperArg {
		cfg := server.Config{}
		var args []string // the rest are tether-plugin's own arguments
		for _, a := range os.Args[2:] {
			if file, ok := strings.CutPrefix(a, "clock="); ok {
				cfg.Now = fileClock(file)
				continue
			}
			if v, ok := strings.CutPrefix(a, "versions="); ok {
				for _, f := range strings.Split(v, ",") {
					n, _ := strconv.Atoi(f)
					cfg.Versions = append(cfg.Versions, n)
				}
				continue
			}
			args = append(args, a)
		}
		os.Exit(server.Main(context.Background(), args, os.Stdout, os.Stderr, cfg))
	}
	os.Exit(m.Run())
}

var self struct {
	once      sync.Once
	path, sum string
	err       error
}

// selfBinary returns the test binary's path and SHA-256.
func selfBinary(t testing.TB) (string, string) {
	self.once.Do(func() {
		self.path, self.err = os.Executable()
		if self.err != nil {
			return
		}
		var b []byte
		b, self.err = os.ReadFile(self.path)
		sum := sha256.Sum256(b)
		self.sum = hex.EncodeToString(sum[:])
	})
	if self.err != nil {
		t.Fatal(self.err)
	}
	return self.path, self.sum
}

// loadPlugin starts the helper plugin; it is closed at cleanup.
func loadPlugin(t testing.TB, args ...string) *host.Plugin {
	t.Helper()
	path, sum := selfBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := host.Load(ctx, path, sum, host.WithArgs(append([]string{helperArg}, args...)...))
	if err != nil {
		t.Fatalf("load plugin: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// fileClock is a plugin clock a test moves: the real time plus the
// duration written in file ("0s" when the file is missing or unreadable).
func fileClock(file string) func() time.Time {
	return func() time.Time {
		b, err := os.ReadFile(file)
		if err != nil {
			return time.Now()
		}
		off, err := time.ParseDuration(strings.TrimSpace(string(b)))
		if err != nil {
			return time.Now()
		}
		return time.Now().Add(off)
	}
}

// setClock moves the clock of a plugin loaded with "clock="+file to the
// real time plus off.
func setClock(t testing.TB, file string, off time.Duration) {
	t.Helper()
	if err := os.WriteFile(file, []byte(off.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// nopAgent is the agent side of the test connection: the tests drive the
// host library directly, so any ACP request from the client is unexpected.
type nopAgent struct{}

func unexpected(m string) error { return acp.NewMethodNotFound(m + " (unexpected in this test)") }

func (nopAgent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, unexpected("authenticate")
}
func (nopAgent) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{}, unexpected("initialize")
}
func (nopAgent) Cancel(context.Context, acp.CancelNotification) error { return unexpected("cancel") }
func (nopAgent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, unexpected("session/close")
}
func (nopAgent) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, unexpected("session/list")
}
func (nopAgent) NewSession(context.Context, acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	return acp.NewSessionResponse{}, unexpected("session/new")
}
func (nopAgent) Prompt(context.Context, acp.PromptRequest) (acp.PromptResponse, error) {
	return acp.PromptResponse{}, unexpected("session/prompt")
}
func (nopAgent) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, unexpected("session/resume")
}
func (nopAgent) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, unexpected("session/set_config_option")
}
func (nopAgent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, unexpected("session/set_mode")
}

// link is one real ACP connection (acp-go-sdk on both ends, over pipes)
// whose agent side is handed to the plugin.
type link struct {
	client *acptest.Client
	conn   *host.Conn
	asc    *acp.AgentSideConnection
	// cut closes both pipes: the transport is lost.
	cut func()
}

func newLink(t testing.TB, p *host.Plugin, client *acptest.Client, principal string) *link {
	t.Helper()
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	asc := acp.NewAgentSideConnection(nopAgent{}, a2cW, c2aR)
	csc := acp.NewClientSideConnection(client, c2aW, a2cR)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	asc.SetLogger(quiet)
	csc.SetLogger(quiet)
	cut := func() {
		_ = c2aW.Close()
		_ = a2cW.Close()
		_ = c2aR.Close()
		_ = a2cR.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := p.Connect(ctx, asc, principal)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cut(); _ = conn.Close() })
	return &link{client: client, conn: conn, asc: asc, cut: cut}
}

// newClient returns a test ACP client serving a fresh directory and
// admitting every attach with the given lease.
func newClient(t testing.TB, lease time.Time) *acptest.Client {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &acptest.Client{Root: root, Attach: grantUntil(lease, 7)}
}

func grantUntil(lease time.Time, gen uint64) acptest.AttachFunc {
	return func(ctx context.Context, req acpmeta.AttachRequest) (acpmeta.AttachResponse, error) {
		return acpmeta.AttachResponse{LeaseNotAfter: lease, GrantGeneration: gen}, nil
	}
}

func tuple(owner, root string) admission.Tuple {
	return admission.Tuple{Owner: owner, Allocation: "alloc-1", Session: "tether-s1", Workspace: "ws",
		Sandbox: "sbx", Generation: 1, Executor: "exec-1", Site: "site-a", Root: root}
}

// bindMeta is `_meta` as a client sends it (JSON round trip).
func bindMeta(t testing.TB, tu admission.Tuple, lease time.Time) map[string]any {
	b, err := json.Marshal(acpmeta.Bind{Tuple: tu, LeaseNotAfter: lease}.Meta())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails unless err carries code.
func wantCode(t testing.TB, err error, code string) {
	t.Helper()
	got, ok := acperr.CodeOf(err)
	if !ok || string(got) != code {
		t.Fatalf("error = %v (code %q), want code %q", err, got, code)
	}
}

// callsOf returns the recorded callbacks with the given method.
func callsOf(c *acptest.Client, method string) []acptest.Call {
	var out []acptest.Call
	for _, call := range c.Calls() {
		if call.Method == method {
			out = append(out, call)
		}
	}
	return out
}

var errTest = errors.New("test")

// exitCode is a command's exit code, or -1 if it has none.
func exitCode(r host.CommandResult) int {
	if r.Exit.ExitCode == nil {
		return -1
	}
	return *r.Exit.ExitCode
}

// signal is the signal that killed a command, or "".
func signal(r host.CommandResult) string {
	if r.Exit.Signal == nil {
		return ""
	}
	return *r.Exit.Signal
}
