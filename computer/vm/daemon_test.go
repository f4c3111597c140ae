package vm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationVMDaemonKilled: `tether-computer serve --vm tcg` makes a
// VM computer (create --tier vm through its API); SIGKILL of the daemon
// takes QEMU with it, and the next daemon says the computer failed and
// leaves nothing of it: no QEMU, no directory, no cgroup.
func TestIntegrationVMDaemonKilled(t *testing.T) {
	testenv.Require(t, "root", "qemu")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.VMGuest, bins.Computer)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "tether-vm-daemon-") // traversable, unlike t.TempDir's parent
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	cl := client.Unix(sock)
	d := startDaemon(ctx, t, b, dir, cl)
	c, err := cl.Create(ctx, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 192 << 20}})
	if err != nil {
		t.Fatalf("create --tier vm: %v\n%s", err, d.log.String())
	}
	if c.Tier != api.TierVM || c.Accelerator != AccelTCG {
		t.Fatalf("created %+v", c)
	}
	mdir := filepath.Join(dir, "state", "computers", c.ID)
	st := vmState(t, mdir)
	if zombieOrGone(st.QEMUPID) {
		t.Fatalf("QEMU %d is not running: the checks below would prove nothing", st.QEMUPID)
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
	waitGone(t, st.QEMUPID)
	d = startDaemon(ctx, t, b, dir, cl)
	got, err := cl.Get(ctx, c.ID)
	if err != nil || got.State != api.StateFailed {
		t.Fatalf("after the daemon's SIGKILL and restart: %+v %v", got, err)
	}
	t.Logf("after the daemon's SIGKILL: %s (%s)", got.State, got.Reason)
	p := NewProvisioner(Config{})
	if err := nothingLeft(mdir, cgroups{root: p.cgroupRoot(), name: st.Cgroup}, st.QEMUPID); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.done
}

type daemon struct {
	cmd  *exec.Cmd
	log  *lockedBuffer
	done chan struct{}
}

// startDaemon runs serve --vm tcg on dir and waits for /healthz; the
// daemon is killed at cleanup if still running.
func startDaemon(ctx context.Context, t *testing.T, b bins.Set, dir string, cl *client.Client) *daemon {
	t.Helper()
	d := &daemon{log: &lockedBuffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(b.Path(bins.Computer), "serve", "--dir", filepath.Join(dir, "state"),
		"--socket", filepath.Join(dir, "api.sock"), "--bin", b.Dir, "--vm", "tcg", "--pool", "0")
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for cl.Health(wctx) != nil {
		select {
		case <-d.done:
			t.Fatalf("serve exited:\n%s", d.log.String())
		case <-wctx.Done():
			t.Fatalf("serve never answered:\n%s", d.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return d
}

// waitGone waits until pid has exited (QEMU is its PID namespace's
// init, reaped by the daemon that died: it may stay a zombie of init).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !zombieOrGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("QEMU %d outlived its daemon by 30 s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
