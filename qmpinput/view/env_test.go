package view

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/tetherdev/tether/fixtures/guest/screenvm"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/rfb"
	"github.com/tetherdev/tether/qmpinput/statedir"
	"github.com/tetherdev/tether/qmpinput/token"
)

var shared struct {
	once sync.Once
	vm   *screenvm.VM
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.vm != nil {
		shared.vm.Close()
	}
	os.Exit(code)
}

// sharedVM boots one 1280x800 view guest for the package.
func sharedVM(tb testing.TB) *screenvm.VM {
	tb.Helper()
	testenv.Require(tb, "qemu")
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		shared.vm, shared.err = screenvm.Boot(ctx, 1280, 800)
	})
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.vm
}

// clock is a settable clock for token expiry.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.off) }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// env is one live view on the shared guest: a real adapter on its QMP
// socket, a state directory, and the server on a loopback port.
type env struct {
	vm      *screenvm.VM
	adapter *qmpinput.Adapter
	dir     *statedir.Dir
	store   *token.Store
	srv     *Server
	origin  string
	clock   *clock
	state   string
	begins  chan time.Time // when each handover_begin record was written
	// onEnd, if set, runs while a handover_end record is written: the
	// hold is released, the agent still fenced.
	onEnd atomic.Pointer[func()]
}

func newEnv(tb testing.TB, mod func(*Config)) *env {
	tb.Helper()
	vm := sharedVM(tb)
	e := &env{vm: vm, clock: &clock{}, state: filepath.Join(tb.TempDir(), "state"), begins: make(chan time.Time, 64)}
	var err error
	if e.dir, err = statedir.Open(e.state); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.dir.Close() })
	aud := NewAuditor(auditlog.New(e.dir, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.adapter, err = qmpinput.Open(ctx, qmpinput.Config{Socket: vm.QMP, Display: qmpinput.Display{Device: "video0"},
		Audit: func(ev qmpinput.AuditEvent) {
			aud.Record(ev)
			if ev.Kind == "handover_begin" {
				e.begins <- time.Now()
			}
			if f := e.onEnd.Load(); ev.Kind == "handover_end" && f != nil {
				(*f)()
			}
		}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.adapter.Close() })
	e.store = token.Open(e.dir, e.clock.now)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	e.origin = "http://" + l.Addr().String()
	cfg := Config{Adapter: e.adapter, VNC: vm.VNC, Tokens: e.store, Auditor: aud, Origins: []string{e.origin},
		Now: e.clock.now, Logf: tb.Logf}
	if mod != nil {
		mod(&cfg)
	}
	if e.srv, err = New(cfg); err != nil {
		tb.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(sctx, l) }()
	tb.Cleanup(func() { stop(); <-done })
	return e
}

// mint returns a one-time link's secret and the token.
func (e *env) mint(tb testing.TB, role token.Role, ttl time.Duration, label string) (token.Token, string) {
	tb.Helper()
	tok, secret, err := e.store.Mint(role, ttl, label)
	if err != nil {
		tb.Fatal(err)
	}
	return tok, string(secret)
}

func (e *env) link(secret string) string { return e.origin + "/#t=" + secret }

// records returns the audit log, verified.
func (e *env) records(tb testing.TB) []auditlog.Record {
	tb.Helper()
	recs, err := auditlog.Read(e.dir)
	if err != nil {
		tb.Fatal(err)
	}
	return recs
}

// viewerOf returns the open viewer of a token.
func (e *env) viewerOf(tokenID string) *viewer {
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	for _, v := range e.srv.viewers {
		if v.tokenID == tokenID {
			return v
		}
	}
	return nil
}

// waitFor polls cond every 10 ms until it holds or ctx ends.
func waitFor(tb testing.TB, ctx context.Context, what string, cond func() bool) {
	tb.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			tb.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// goClient is a viewer written in Go: an HTTP client with a cookie jar
// and the Origin of the page.
type goClient struct {
	e      *env
	hc     *http.Client
	origin string
}

func (e *env) client(origin string) *goClient {
	jar, _ := cookiejar.New(nil)
	return &goClient{e: e, hc: &http.Client{Jar: jar, Timeout: 20 * time.Second}, origin: origin}
}

// exchange posts a link's secret and returns the status and the JSON code.
func (c *goClient) exchange(secret string) (int, string) {
	body, _ := json.Marshal(map[string]string{"token": secret})
	req, _ := http.NewRequest(http.MethodPost, c.e.origin+"/api/session", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if c.origin != "" {
		req.Header.Set("Origin", c.origin)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var out struct {
		Code string `json:"code"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	// The jar keeps Secure cookies only for https; tests over http
	// carry the cookie themselves, as a browser on loopback does.
	for _, ck := range resp.Cookies() {
		u, _ := url.Parse(c.e.origin)
		ck.Secure = false
		c.hc.Jar.SetCookies(u, []*http.Cookie{ck})
	}
	return resp.StatusCode, out.Code
}

// dial opens a WebSocket at path with the client's cookie and Origin.
func (c *goClient) dial(ctx context.Context, path string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	if c.origin != "" {
		h.Set("Origin", c.origin)
	}
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(c.e.origin, "http")+path,
		&websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
}

// control opens the control socket and reads the hello.
func (c *goClient) control(ctx context.Context) (*websocket.Conn, hello, error) {
	ws, _, err := c.dial(ctx, "/ws/control")
	if err != nil {
		return nil, hello{}, err
	}
	_, b, err := ws.Read(ctx)
	var h hello
	if err == nil {
		err = json.Unmarshal(b, &h)
	}
	return ws, h, err
}

// screen opens the viewer's RFB socket and runs the viewer's handshake.
func (c *goClient) screen(ctx context.Context, viewerID string) (net.Conn, error) {
	ws, _, err := c.dial(ctx, "/ws/rfb?viewer="+viewerID)
	if err != nil {
		return nil, err
	}
	nc := websocket.NetConn(context.Background(), ws, websocket.MessageBinary)
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := rfb.ClientHandshake(nc); err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return nc, nil
}

// op sends a page command on the control socket.
func op(ctx context.Context, ws *websocket.Conn, name string) error {
	return ws.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"op":%q}`, name)))
}

// readUntil reads control messages until match returns true.
func readUntil(ctx context.Context, ws *websocket.Conn, match func(map[string]any) bool) (map[string]any, error) {
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		if match(m) {
			return m, nil
		}
	}
}

// probeStatus asks QEMU's probe socket for the run state ("running",
// "paused"), through go-qemu: the adapter's closed set has no query.
func probeStatus(ctx context.Context, vm *screenvm.VM) (string, error) {
	mon, err := newProbe(vm)
	if err != nil {
		return "", err
	}
	defer mon.Disconnect()
	st, err := raw.NewMonitor(mon).QueryStatus()
	if err != nil {
		return "", err
	}
	return st.Status.String(), nil
}

// agentKeySentinel types one key through the agent's adapter and waits
// until the guest saw it: everything a test sent before it has then
// reached the guest or never will.
func (e *env) agentKeySentinel(tb testing.TB, ctx context.Context) {
	tb.Helper()
	if err := e.adapter.Key(ctx, "z"); err != nil {
		tb.Fatalf("agent sentinel key: %v", err)
	}
	if _, err := e.vm.Collect(ctx, func(ev screenvm.Event) bool { return ev == screenvm.Event{Type: 1, Code: 44} }); err != nil {
		tb.Fatalf("agent sentinel never reached the guest: %v", err)
	}
}

// eventsBefore returns the guest events since mark, without the final
// sentinel key (z down and up).
func eventsBefore(vm *screenvm.VM, mark int) []screenvm.Event {
	evs := vm.EventsSince(mark)
	var out []screenvm.Event
	for _, ev := range evs {
		if ev.Type == 1 && ev.Code == 44 {
			continue
		}
		out = append(out, ev)
	}
	return out
}

var countLine = regexp.MustCompile(`^count (\d+)$`)

func newProbe(vm *screenvm.VM) (*qmp.SocketMonitor, error) {
	m, err := qmp.NewSocketMonitor("unix", vm.Probe, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return m, m.Connect()
}
