package vm

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/coordinator"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/computer"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// svcMemory is the size of every VM computer the harness makes: one
// size, so that one saved state serves them all.
const svcMemory = 192 << 20

// svcHarness is the real computer service (computer/service) with this
// package's TCG provisioner as its vm tier and the namespaced one as its
// default, as tether-computer serve runs them, in one of serve's two VM
// modes (svcMode). It records the machines the vm tier makes, so that a
// test can reach a computer's control port as the service itself does.
type svcHarness struct {
	s      *service.Service
	p      *Provisioner
	rec    *recordingProvisioner
	base   string
	caller api.Caller
}

// recordingProvisioner is the vm tier's provisioner, remembering the
// machine it prepared in each directory.
type recordingProvisioner struct {
	*Provisioner
	mu   sync.Mutex
	made map[string]*Machine
}

// Prepare implements api.Provisioner.
func (r *recordingProvisioner) Prepare(ctx context.Context, dir string, limits api.Limits) (api.Machine, error) {
	am, err := r.Provisioner.Prepare(ctx, dir, limits)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.made[filepath.Base(dir)] = am.(*Machine)
	r.mu.Unlock()
	return am, nil
}

func (r *recordingProvisioner) machine(id string) *Machine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.made[id]
}

// svcMode is how the vm tier starts a guest: the two ways serve runs it.
type svcMode int

const (
	// svcGuestImage: every computer boots cold with the guest image
	// (Debian's bash, perl, python3, curl, git) as its root, on a
	// writable disk of its disk_bytes; serve's default.
	svcGuestImage svcMode = iota
	// svcSavedState: every computer starts from a saved state (the
	// first create makes it) that carries the guest image, on its own
	// qcow2 layer; serve --vm-state. A create costs a restore (about
	// 1.5 s), not a boot.
	svcSavedState
)

// newSvcHarness opens the service beneath a fresh directory; it is
// closed at t's cleanup. It requires root, QEMU and the guest image.
func newSvcHarness(t testing.TB, mode svcMode) *svcHarness {
	t.Helper()
	testenv.Require(t, "root", "qemu", "guestimage")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	set, err := bins.Build(ctx, bins.Receiver, bins.VMGuest)
	if err != nil {
		t.Fatal(err)
	}
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Bins: set, Accel: AccelTCG}
	if mode == svcSavedState {
		cfg.StateDir = filepath.Join(base, "state")
	}
	p := NewProvisioner(cfg)
	rec := &recordingProvisioner{Provisioner: p, made: map[string]*Machine{}}
	s, err := service.Open(ctx, service.Config{Dir: filepath.Join(base, "svc"),
		Provisioner:  provision.NewProvisioner(provision.Config{Bins: set}),
		Provisioners: map[string]api.Provisioner{api.TierVM: rec}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &svcHarness{s: s, p: p, rec: rec, base: base, caller: api.Caller{Owner: "alice"}}
}

// create makes a running VM computer through the service with limits
// (its memory always svcMemory); it is deleted at t's cleanup, which
// fails t if anything of it is left.
func (h *svcHarness) create(t testing.TB, ctx context.Context, limits api.Limits) *svcComputer {
	t.Helper()
	limits.MemoryBytes = svcMemory
	c, err := h.s.Create(ctx, h.caller, api.CreateRequest{Tier: api.TierVM, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	m := h.rec.machine(c.ID)
	if m == nil {
		t.Fatalf("the service made %s without the vm tier's provisioner", c.ID)
	}
	cfg, err := custodian.LoadConfig(c.CustodianConfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tier != api.TierVM || c.Tuple == nil || !cfg.Tuple.Equal(*c.Tuple) {
		t.Fatalf("created %+v with a custodian configuration for %+v", c, cfg.Tuple)
	}
	sc := &svcComputer{h: h, c: c, m: m, cfg: cfg}
	t.Cleanup(func() {
		if err := sc.Close(context.Background()); err != nil {
			t.Errorf("delete %s: %v", c.ID, err)
		}
	})
	return sc
}

// svcComputer is a VM computer the service made, seen as the end-to-end
// suites see a computer (fixtures/computer.Computer, Restarter,
// ReceiverKiller): the custodian reaches its receiver through the
// configuration the service handed out; grants, files and processes go
// through the guest's control port, as the service's own calls do.
type svcComputer struct {
	h   *svcHarness
	c   api.Computer
	m   *Machine
	cfg *custodian.Config

	closeOnce sync.Once
	closeErr  error
}

var (
	_ computer.Computer       = (*svcComputer)(nil)
	_ computer.Restarter      = (*svcComputer)(nil)
	_ computer.ReceiverKiller = (*svcComputer)(nil)
)

// Tuple implements computer.Computer.
func (c *svcComputer) Tuple() admission.Tuple { return *c.c.Tuple }

// Grant implements computer.Computer.
func (c *svcComputer) Grant() admission.Grant { return c.m.grants.Current() }

// Receiver implements computer.Computer: the endpoint of the custodian
// configuration the service handed out.
func (c *svcComputer) Receiver() custodian.ReceiverConfig { return c.cfg.Receiver }

// Publish implements computer.Computer: the guest's clock is set, the
// snapshot signed into the computer's admission directory and pushed to
// the guest, as Machine.Grant does.
func (c *svcComputer) Publish(ctx context.Context, notAfter time.Time, grants ...admission.Grant) (signedfile.Published, error) {
	if err := c.m.syncClock(ctx); err != nil {
		return signedfile.Published{}, err
	}
	pub, err := c.m.grants.Publish(ctx, notAfter, grants...)
	if err != nil {
		return pub, err
	}
	return pub, c.m.pushAdmission(ctx)
}

// Coordinate implements computer.Computer with the real coordinator.
func (c *svcComputer) Coordinate(ctx context.Context, r coordinator.Renewer, requested time.Time) (coordinator.Round, error) {
	if err := c.m.syncClock(ctx); err != nil {
		return coordinator.Round{}, err
	}
	round, err := c.m.grants.Coordinate(ctx, r, requested)
	if err != nil {
		return round, err
	}
	return round, c.m.pushAdmission(ctx)
}

// Stat implements computer.Computer, answered by the guest's kernel.
func (c *svcComputer) Stat(ctx context.Context, rel string) (computer.FileInfo, error) {
	resp, err := c.m.ctlCall(ctx, ctl.Request{Op: ctl.OpStat, Path: rel})
	if err != nil {
		return computer.FileInfo{}, err
	}
	if resp.File == nil {
		return computer.FileInfo{}, fmt.Errorf("%w: stat answer without a file", ctl.ErrProtocol)
	}
	f := resp.File
	return computer.FileInfo{Name: f.Name, Mode: fs.FileMode(f.Mode), UID: f.UID, GID: f.GID, Size: f.Size}, nil
}

// ReadFile implements computer.Computer, read by the guest.
func (c *svcComputer) ReadFile(ctx context.Context, rel string) ([]byte, error) {
	resp, err := c.m.ctlCall(ctx, ctl.Request{Op: ctl.OpRead, Path: rel})
	if err != nil {
		return nil, err
	}
	if resp.Data == nil {
		return []byte{}, nil
	}
	return resp.Data, nil
}

// Processes implements computer.Computer: the guest's processes of the
// grant's uid.
func (c *svcComputer) Processes(ctx context.Context) ([]computer.Process, error) {
	resp, err := c.m.ctlCall(ctx, ctl.Request{Op: ctl.OpProcesses})
	if err != nil {
		return nil, err
	}
	var out []computer.Process
	for _, p := range resp.Processes {
		out = append(out, computer.Process{PID: p.PID, PPID: p.PPID, UID: p.UID, Comm: p.Comm, Cmdline: p.Cmdline})
	}
	return out, nil
}

// Cgroup is the guest receiver's cgroup mode as its start-up line in
// the receiver's log states it (computer.CgroupRequired when it contains
// commands in cgroups), the question the pipeline's escapee test asks.
func (c *svcComputer) Cgroup() string {
	b, err := os.ReadFile(c.m.paths.receiverLog)
	if err == nil && strings.Contains(string(b), `"cgroup":"required"`) {
		return computer.CgroupRequired
	}
	return ""
}

// StopReceiver implements computer.Restarter.
func (c *svcComputer) StopReceiver(ctx context.Context) error {
	_, err := c.m.ctlCall(ctx, ctl.Request{Op: ctl.OpStopReceiver})
	return err
}

// KillReceiver implements computer.ReceiverKiller.
func (c *svcComputer) KillReceiver(ctx context.Context) error {
	_, err := c.m.ctlCall(ctx, ctl.Request{Op: ctl.OpKillReceiver})
	return err
}

// StartReceiver implements computer.Restarter: it starts the guest's
// receiver with drop removed from its bounding set and waits until it
// admits the tuple through the wire socket, or returns the
// *computer.ExitError of one that refused to start.
func (c *svcComputer) StartReceiver(ctx context.Context, drop ...string) error {
	if _, err := c.m.ctlCall(ctx, ctl.Request{Op: ctl.OpStartReceiver, Drop: drop}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, computer.ReadyTimeout)
	defer cancel()
	var last error
	for i := 0; ; i++ {
		if _, last = provision.AttachVia(ctx, c.m, c.Tuple()); last == nil {
			return nil
		}
		if i%10 == 0 {
			resp, err := c.m.ctlCall(ctx, ctl.Request{Op: ctl.OpStatus})
			if err != nil {
				return err
			}
			if resp.Receiver != nil && !resp.Receiver.Running {
				return &computer.ExitError{Status: resp.Receiver.Exit, Log: resp.Receiver.Log}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the restarted receiver did not admit the tuple: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close implements computer.Computer: the service deletes the computer;
// then no directory, cgroup or QEMU of it may be left. Safe twice.
func (c *svcComputer) Close(ctx context.Context) error {
	c.closeOnce.Do(func() {
		dir := c.m.Dir()
		st, err := readState(dir)
		if err != nil {
			c.closeErr = err
			return
		}
		if err := c.h.s.Delete(ctx, c.h.caller, c.c.ID); err != nil && api.CodeOf(err) != api.CodeNotFound {
			c.closeErr = err
			return
		}
		c.closeErr = nothingLeft(dir, cgroups{root: c.h.p.cgroupRoot(), name: st.Cgroup}, st.QEMUPID)
	})
	return c.closeErr
}

// run runs a shell line as the grant's uid through the custodian's
// configuration and waits for it (exec_start, exec_wait, exec_output).
func (c *svcComputer) run(t testing.TB, ctx context.Context, line string) string {
	t.Helper()
	return execWith(t, ctx, custodianDialer{c.cfg}, c.Tuple(), "/bin/bash", "-c", line)
}
