package faults

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// pauseEnv is tether-computer serve's test hook (TestPauseEnv there).
const pauseEnv = "TETHER_COMPUTER_TEST_PAUSE"

// env is one test's daemon: its binaries, a traversable directory
// holding the state (--dir) and the socket, the client, and the
// computers seen in the state directory so far.
type env struct {
	b    bins.Set
	dir  string
	sock string
	cl   *client.Client
	seen *seen
	d    *daemonProc
}

// newEnv builds the binaries and makes the directory. Its cleanup kills
// any daemon still running and ends (provision.Down) every computer left
// in the state directory, so that a failed test leaks nothing either.
func newEnv(ctx context.Context, t *testing.T) *env {
	t.Helper()
	testenv.Require(t, "root", "cgroup-limits", "cgroup-freezer", "loop")
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "tether-faults-") // t.TempDir's parent is not traversable
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	e := &env{b: b, dir: dir, sock: filepath.Join(dir, "api.sock"), cl: client.Unix(filepath.Join(dir, "api.sock"))}
	e.seen = newSeen(e.state())
	t.Cleanup(func() {
		if e.d != nil {
			e.d.kill()
		}
		for _, sub := range []string{"computers", "pool"} {
			ents, _ := os.ReadDir(filepath.Join(e.state(), sub))
			for _, m := range ents {
				if err := provision.Down(context.Background(), filepath.Join(e.state(), sub, m.Name())); err != nil {
					t.Errorf("cleanup: %s/%s: %v", sub, m.Name(), err)
				}
			}
		}
		_ = os.RemoveAll(dir)
	})
	return e
}

func (e *env) state() string { return filepath.Join(e.dir, "state") }

// start runs `tether-computer serve` (pausing at pause, if not empty)
// with small computers, no warm pool unless args set one, and waits
// until it answers /healthz.
func (e *env) start(ctx context.Context, t *testing.T, pause string, args ...string) *daemonProc {
	t.Helper()
	argv := append([]string{"serve", "--dir", e.state(), "--socket", e.sock, "--bin", e.b.Dir,
		"--memory", "268435456", "--disk", "67108864", "--pool", "0"}, args...)
	d := &daemonProc{cmd: exec.Command(e.b.Path(bins.Computer), argv...), done: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = &d.logs, &d.logs
	d.cmd.Env = os.Environ()
	if pause != "" {
		d.cmd.Env = append(d.cmd.Env, pauseEnv+"="+pause)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	e.d = d
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log (pid %d):\n%s", d.cmd.Process.Pid, d.logs.String())
		}
	})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if e.cl.Health(wctx) == nil {
			return d
		}
		select {
		case <-d.done:
			t.Fatalf("tether-computer serve exited: %v\n%s", d.err, d.logs.String())
		case <-wctx.Done():
			t.Fatalf("tether-computer serve never answered /healthz\n%s", d.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// daemonProc is one `tether-computer serve` process.
type daemonProc struct {
	cmd  *exec.Cmd
	logs syncBuffer
	done chan struct{}
	err  error
}

// kill SIGKILLs the daemon and waits for it to exit.
func (d *daemonProc) kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

// stop SIGTERMs the daemon and waits (at most a minute) for it to exit.
func (d *daemonProc) stop(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		d.kill()
		t.Errorf("tether-computer serve did not stop on SIGTERM")
	}
}

// awaitPause waits until the daemon says it paused at step.
func (d *daemonProc) awaitPause(ctx context.Context, t *testing.T, step string) {
	t.Helper()
	want := "test pause at " + step
	for !strings.Contains(d.logs.String(), want) {
		select {
		case <-d.done:
			t.Fatalf("the daemon exited before pausing at %s: %v\n%s", step, d.err, d.logs.String())
		case <-ctx.Done():
			t.Fatalf("the daemon never paused at %s\n%s", step, d.logs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the daemon's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
