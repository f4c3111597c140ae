package custodian

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// fakeReceiver stands in for the receiver in unit tests of the binding
// logic: it serves the real wire protocol (wireserver.Server) and answers each
// op with a scripted function. Any op without a script fails the test.
// Integration tests use the real receiver.
type fakeReceiver struct {
	t *testing.T

	mu     sync.Mutex
	calls  []*wire.Request
	script map[wire.Op]func(ctx context.Context, req *wire.Request, args any) (any, error)
}

func (f *fakeReceiver) Serve(ctx context.Context, req *wire.Request) (any, error) {
	args, err := req.DecodeArgs()
	if err != nil {
		f.t.Errorf("receiver got undecodable args for %s: %v", req.Op, err)
		return nil, err
	}
	f.mu.Lock()
	f.calls = append(f.calls, req)
	h, ok := f.script[req.Op]
	f.mu.Unlock()
	if !ok {
		f.t.Errorf("unexpected receiver call %s (op key %s)", req.Op, req.OpKey)
		return nil, errcode.Errorf(errcode.CodeInternal, "unexpected")
	}
	return h(ctx, req, args)
}

func (f *fakeReceiver) on(op wire.Op, h func(ctx context.Context, req *wire.Request, args any) (any, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script[op] = h
}

// ops returns the ops the receiver saw, in order.
func (f *fakeReceiver) ops() []wire.Op {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]wire.Op, len(f.calls))
	for i, r := range f.calls {
		out[i] = r.Op
	}
	return out
}

func (f *fakeReceiver) last() *wire.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return nil
	}
	return f.calls[len(f.calls)-1]
}

func (f *fakeReceiver) count(op wire.Op) int {
	n := 0
	for _, o := range f.ops() {
		if o == op {
			n++
		}
	}
	return n
}

// testAgent is a minimal ACP agent: session/new answers a fixed id and,
// like the plugin, calls `_tether/attach` while handling it.
type testAgent struct {
	acp.Agent   // nil: any method not defined below panics, failing the test
	conn        *acp.AgentSideConnection
	sessionID   string
	attachOnNew bool
	attachErr   error
	bound       chan struct{} // closed after session/new's attach, if set
}

func (a *testAgent) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber}, nil
}
func (a *testAgent) NewSession(ctx context.Context, req acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	if a.attachOnNew {
		b, _, err := acpmeta.BindFromMeta(req.Meta)
		if err == nil {
			_, err = a.conn.CallExtension(ctx, acpmeta.MethodAttach,
				acpmeta.AttachRequest{SessionID: a.sessionID, TupleSHA256: b.Tuple.SHA256()})
		}
		a.attachErr = err
	}
	if a.bound != nil {
		defer close(a.bound)
	}
	return acp.NewSessionResponse{SessionId: acp.SessionId(a.sessionID)}, nil
}
func (a *testAgent) LoadSession(context.Context, acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	return acp.LoadSessionResponse{}, nil
}
func (a *testAgent) Prompt(context.Context, acp.PromptRequest) (acp.PromptResponse, error) {
	return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
}

// harness wires a Custodian, a Receiver link to a fakeReceiver and an ACP
// agent connection.
type harness struct {
	t     *testing.T
	c     *Custodian
	fr    *fakeReceiver
	srv   *wireserver.Server
	recv  *Receiver
	conn  *Conn
	agent *testAgent
	tuple admission.Tuple
	lease time.Time
	dir   string
	now   func() time.Time

	mu      sync.Mutex
	serving []net.Conn
}

func testTuple() admission.Tuple {
	return admission.Tuple{Owner: "alice", Allocation: "a1", Session: "s1", Workspace: "w1",
		Sandbox: "sb1", Generation: 1, Executor: "e1", Site: "local", Root: "/srv/tether/w1"}
}

func newHarness(t *testing.T, mod ...func(*Options)) *harness {
	t.Helper()
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, tuple: testTuple(), lease: time.Now().Add(time.Hour), dir: filepath.Join(t.TempDir(), "state"),
		fr: &fakeReceiver{t: t, script: map[wire.Op]func(context.Context, *wire.Request, any) (any, error){}}}
	h.fr.on(wire.OpAttach, func(context.Context, *wire.Request, any) (any, error) {
		return wire.AttachResult{GrantGeneration: 7, NotAfter: time.Now().Add(time.Hour), Ops: []string{"read", "write", "exec", "kill"}}, nil
	})
	opts := Options{StateDir: h.dir, AuditKey: []byte(skey)}
	for _, m := range mod {
		m(&opts)
	}
	if h.c, err = New(opts); err != nil {
		t.Fatal(err)
	}
	if h.srv, err = wireserver.NewServer(h.fr, wireserver.ServerConfig{}); err != nil {
		t.Fatal(err)
	}
	h.recv = NewReceiver(h.dial, Backoff{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond}, nil)
	h.connectAgent(true)
	t.Cleanup(h.close)
	return h
}

func (h *harness) dial(ctx context.Context) (ReceiverConn, error) {
	cli, srv := net.Pipe()
	h.mu.Lock()
	h.serving = append(h.serving, srv)
	h.mu.Unlock()
	go h.srv.ServeConn(context.Background(), srv)
	return wireclient.NewClient(cli, wireclient.ClientConfig{ResponseGrace: 200 * time.Millisecond})
}

// dropReceiver breaks every receiver connection, as a lost transport.
func (h *harness) dropReceiver() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.serving {
		c.Close()
	}
	h.serving = nil
}

func (h *harness) connectAgent(attachOnNew bool) {
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	h.agent = &testAgent{sessionID: "sess-1", attachOnNew: attachOnNew}
	g := &testagent.Gate{R: c2aR, Ready: make(chan struct{})}
	h.agent.conn = acp.NewAgentSideConnection(h.agent, a2cW, g)
	close(g.Ready)
	h.conn = h.c.Serve(c2aW, a2cR, ConnOptions{})
	h.t.Cleanup(func() { c2aW.Close(); a2cW.Close(); h.conn.Close() })
}

func (h *harness) close() {
	h.recv.Close()
	h.srv.Close()
	if err := h.c.Close(); err != nil {
		h.t.Errorf("custodian Close: %v", err)
	}
}

func (h *harness) binding() Binding {
	return Binding{Tuple: h.tuple, LeaseNotAfter: h.lease, Principal: h.tuple.Owner, Receiver: h.recv}
}

// bind runs initialize and session/new; the agent attaches during it.
func (h *harness) bind() {
	h.t.Helper()
	ctx := context.Background()
	if _, err := h.conn.Initialize(ctx); err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: h.tuple.Root, McpServers: []acp.McpServer{}}, h.binding()); err != nil {
		h.t.Fatal(err)
	}
	if h.agent.attachOnNew && h.agent.attachErr != nil {
		h.t.Fatalf("attach during session/new: %v", h.agent.attachErr)
	}
}

func (h *harness) op(key string) map[string]any {
	return acpmeta.Op{TupleSHA256: h.tuple.SHA256(), OpKey: key, Deadline: time.Now().Add(time.Minute)}.Meta()
}

func (h *harness) attach() error {
	_, err := h.agent.conn.CallExtension(context.Background(), acpmeta.MethodAttach,
		acpmeta.AttachRequest{SessionID: h.agent.sessionID, TupleSHA256: h.tuple.SHA256()})
	return err
}

// wantCode asserts err carries the tether code.
func wantCode(t *testing.T, err error, code errcode.Code) {
	t.Helper()
	got, ok := acperr.CodeOf(err)
	if !ok || got != code {
		t.Fatalf("err = %v; want tether code %s", err, code)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func replaceOnce(s, old, new string) string { return strings.Replace(s, old, new, 1) }
