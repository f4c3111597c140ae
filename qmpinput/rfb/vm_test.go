package rfb

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/guest/screenvm"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/qmpinput"
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

// sharedVM boots one 1280x800 view guest for the package's QEMU tests.
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

// switchGate is a Gate a test opens and closes.
type switchGate struct {
	mu   sync.RWMutex
	open atomic.Bool
}

func (g *switchGate) Input(send func() error) (bool, error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if !g.open.Load() {
		return false, nil
	}
	return true, send()
}

// proxied is one running session: the test's viewer end, the session and
// Run's result.
type proxied struct {
	client *testClient
	sess   *Session
	done   chan error
}

// startProxy connects a test viewer through a Session to the guest's VNC
// server over a pinned dial.
func startProxy(t *testing.T, vm *screenvm.VM, gate Gate) *proxied {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	qemu, err := qmpinput.DialPinned(ctx, vm.VNC, uint32(os.Geteuid()))
	if err != nil {
		t.Fatal(err)
	}
	viewerEnd, proxyEnd := net.Pipe()
	hs := make(chan error, 1)
	go func() { _, err := Handshake(ctx, proxyEnd, qemu, "tether test"); hs <- err }()
	client, err := newTestClient(viewerEnd)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-hs; err != nil {
		t.Fatal(err)
	}
	if client.init.Width != uint16(vm.Width) || client.init.Height != uint16(vm.Height) || client.init.Name != "tether test" {
		t.Fatalf("viewer got ServerInit %+v, want %dx%d named by the proxy", client.init, vm.Width, vm.Height)
	}
	p := &proxied{client: client, sess: NewSession(proxyEnd, qemu, gate), done: make(chan error, 1)}
	go func() { p.done <- p.sess.Run(context.Background()) }()
	t.Cleanup(func() { p.sess.Close(); <-p.done })
	if err := client.setup(); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitCount polls a counter until it reaches want; the session counts a
// message only after it handled it.
func waitCount(t *testing.T, ctx context.Context, c interface{ Load() int64 }, want int64) {
	t.Helper()
	for c.Load() < want {
		select {
		case <-ctx.Done():
			t.Fatalf("counter at %d, want %d", c.Load(), want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
