package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/computer/vm/muxlink"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// identityProbe prints the guest's machine id, boot id and 32 bytes of
// its kernel's random output, each on one line.
const identityProbe = "cat /etc/machine-id; cat /proc/sys/kernel/random/boot_id; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"

// TestIntegrationVMSavedState: computers started from one saved state
// do not share an identity (receiver TLS key, /etc/machine-id, boot id,
// the kernel's random output) and each runs a command through the
// custodian's path; the state is made once and a stale one is made
// again; deleting a restored computer leaves nothing.
func TestIntegrationVMSavedState(t *testing.T) {
	p, base := testProvisioner(t)
	p.cfg.StateDir = filepath.Join(base, "state")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	a := prepareGranted(t, ctx, p, filepath.Join(base, "a"))
	ino := stateInode(t, p)
	b := prepareGranted(t, ctx, p, filepath.Join(base, "b"))
	if got := stateInode(t, p); got != ino {
		t.Fatalf("the saved state was made again for the second computer (inode %d, then %d)", ino, got)
	}
	ia, ib := probeIdentity(t, ctx, a), probeIdentity(t, ctx, b)
	for i, what := range []string{"/etc/machine-id", "boot_id", "32 bytes of /dev/urandom"} {
		if ia[i] == ib[i] {
			t.Errorf("two computers from one saved state share %s: %q", what, ia[i])
		}
	}
	if ia[0] != a.machineID || ib[0] != b.machineID {
		t.Errorf("machine ids %q, %q; injected %q, %q", ia[0], ib[0], a.machineID, b.machineID)
	}
	ka, _ := a.creds.Server.KeyPEM()
	kb, _ := b.creds.Server.KeyPEM()
	if string(ka) == string(kb) || string(a.creds.Server.CertPEM()) == string(b.creds.Server.CertPEM()) {
		t.Error("two computers share the receiver's TLS key or certificate")
	}
	closeGone(t, ctx, a)

	// A stale slot (its key differs) is made again before use.
	slot := slotDir(t, p)
	if err := os.WriteFile(filepath.Join(slot, "key"), []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	p2 := NewProvisioner(p.cfg)
	c := prepareGranted(t, ctx, p2, filepath.Join(base, "c"))
	if got := stateInode(t, p2); got == ino {
		t.Fatal("a stale saved state was used")
	}
	if ic := probeIdentity(t, ctx, c); ic[0] != c.machineID {
		t.Errorf("machine id %q, injected %q", ic[0], c.machineID)
	}
	closeGone(t, ctx, b)
	closeGone(t, ctx, c)
	if _, err := os.Lstat(filepath.Join(p.cfg.StateDir, ".template")); !os.IsNotExist(err) {
		t.Errorf("the template's directory is left: %v", err)
	}
}

// prepareGranted makes a computer of 192 MiB and grants it.
func prepareGranted(t *testing.T, ctx context.Context, p *Provisioner, dir string) *Machine {
	t.Helper()
	start := time.Now()
	am, err := p.Prepare(ctx, dir, api.Limits{MemoryBytes: 192 << 20, Pids: 64, DiskBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m := am.(*Machine)
	t.Cleanup(func() { m.Close(context.Background()) })
	if m.saved == nil {
		t.Fatal("the computer did not start from the saved state")
	}
	if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: prepare and grant from the saved state: %s", filepath.Base(dir), time.Since(start).Round(time.Millisecond))
	return m
}

// probeIdentity runs identityProbe in m through the custodian's path.
func probeIdentity(t *testing.T, ctx context.Context, m *Machine) []string {
	t.Helper()
	out := strings.Fields(execIn(t, ctx, m, "/bin/sh", "-c", identityProbe))
	if len(out) != 3 || len(out[2]) != 64 {
		t.Fatalf("identity probe printed %q", out)
	}
	return out
}

func stateInode(t *testing.T, p *Provisioner) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(slotDir(t, p), "state.mig"), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// slotDir is the one slot of 192 MiB in p's state directory: m192, or
// m192-dBYTES when the guest boots the guest image.
func slotDir(t *testing.T, p *Provisioner) string {
	t.Helper()
	slots, err := filepath.Glob(filepath.Join(p.cfg.StateDir, "m192*"))
	if err != nil || len(slots) != 1 {
		t.Fatalf("slots of 192 MiB: %q, %v; want one", slots, err)
	}
	return slots[0]
}

// closeGone closes m and checks that no QEMU, directory (overlay,
// sockets) or cgroup is left; QEMU's namespaces die with it.
func closeGone(t *testing.T, ctx context.Context, m *Machine) {
	t.Helper()
	pid := m.vm.PID()
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !zombieOrGone(pid) {
		t.Fatalf("QEMU %d runs after Close", pid)
	}
	for _, d := range []string{m.Dir(), m.cg.dir("memory"), m.cg.dir("pids"), m.cg.dir("cpuacct")} {
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Errorf("%s is left after Close: %v", d, err)
		}
	}
}

// TestStateDirRefusesOthersWrite: a state directory another user owns or
// may write is refused (every guest starts from what is in it); the
// positive control is the same directory once root's and 0755.
func TestStateDirRefusesOthersWrite(t *testing.T) {
	testenv.Require(t, "root")
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, prep := range map[string]func() error{
		"group-writable": func() error { return os.Chmod(dir, 0o775) },
		"other-writable": func() error { return os.Chmod(dir, 0o757) },
		"another owner":  func() error { return errors.Join(os.Chmod(dir, 0o755), os.Chown(dir, 60001, 0)) },
	} {
		if err := errors.Join(os.Chown(dir, 0, 0), os.Chmod(dir, 0o755), prep()); err != nil {
			t.Fatal(err)
		}
		if err := checkStateDir(dir); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
	}
	if err := errors.Join(os.Chown(dir, 0, 0), os.Chmod(dir, 0o755)); err != nil {
		t.Fatal(err)
	}
	if err := checkStateDir(dir); err != nil {
		t.Fatalf("root's 0755 state dir refused: %v", err)
	}
}

// TestIntegrationVMRestoredServesOnlyWithIdentity: a guest restored from
// the saved state runs no wire bridge and no receiver, and refuses the
// control ops that act on the grant's uid, until the host injects its
// identity; then (the positive control) the same guest answers.
func TestIntegrationVMRestoredServesOnlyWithIdentity(t *testing.T) {
	p, base := testProvisioner(t)
	p.cfg.StateDir = filepath.Join(base, "state")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	m := &Machine{p: p, paths: layout(filepath.Join(base, "vm")), limits: api.Limits{MemoryBytes: 192 << 20, Pids: 64}}
	defer m.Close(context.Background())
	err := provision.RunSteps(ctx, "vm", []provision.Step{
		{Name: "validate.Limits", Run: m.validate},
		{Name: "allocate.IDs", Run: m.allocate},
		{Name: "layout.Directories", Run: m.makeLayout},
		{Name: "pki.Certificates", Run: m.makePKI},
		{Name: "admission.Key", Run: m.makeSigningKey},
		{Name: "guest.Image", Run: m.chooseImage},
		{Name: "qemu.Cgroups", Run: m.makeCgroups},
		{Name: "qemu.Boot", Run: m.boot},
	}, m.teardown, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.saved == nil {
		t.Fatal("the guest did not start from the saved state")
	}
	for _, op := range []ctl.Op{ctl.OpProcesses, ctl.OpKillCommands, ctl.OpStartReceiver} {
		if _, err := m.ctlCall(ctx, ctl.Request{Op: op}); err == nil || !strings.Contains(err.Error(), "no identity") {
			t.Errorf("%s before the identity: err = %v, want a refusal", op, err)
		}
	}
	resp, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpStatus})
	if err != nil || resp.Receiver == nil || resp.Receiver.Running {
		t.Fatalf("status before the identity: %+v, %v; want no receiver running", resp.Receiver, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	c, err := m.dialGuest(wctx, m.paths.guestWire)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := muxlink.Host(wctx, c); err == nil {
		t.Fatal("the wire port answered before the identity")
	}
	wcancel()
	c.Close()
	for _, step := range []func(context.Context) error{m.syncClock, m.inject, m.startWire, m.waitAnswering} {
		if err := step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if out := strings.TrimSpace(execIn(t, ctx, m, "/bin/sh", "-c", "id -u")); out != fmt.Sprint(m.alloc.UID) {
		t.Fatalf("id -u printed %q, want %d", out, m.alloc.UID)
	}
}

// TestIntegrationVMSavedSvc: two VM computers the service makes
// from one saved state answer, through their custodians' configuration,
// with different machine ids, boot ids and kernel random output; a
// lease renewed while one is suspended reaches its guest; delete leaves
// nothing of either.
func TestIntegrationVMSavedSvc(t *testing.T) {
	p, base := testProvisioner(t)
	p.cfg.StateDir = filepath.Join(base, "state")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := openTierService(t, ctx, p, base)
	defer s.Close()
	alice := api.Caller{Owner: "alice"}
	var probes [][]string
	var made []api.Computer
	for i := range 2 {
		start := time.Now()
		c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 192 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		out := strings.Fields(runVia(t, ctx, dialerOf(t, c), c.Tuple, identityProbe))
		t.Logf("BENCH create -> first command, TCG, computer %d from the saved state, through the service: %s", i, time.Since(start).Round(time.Millisecond))
		if len(out) != 3 {
			t.Fatalf("identity probe printed %q", out)
		}
		probes, made = append(probes, out), append(made, c)
	}
	for i, what := range []string{"/etc/machine-id", "boot_id", "32 bytes of /dev/urandom"} {
		if probes[0][i] == probes[1][i] {
			t.Errorf("two computers from one saved state share %s: %q", what, probes[0][i])
		}
	}
	c := made[0]
	if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, alice, c.ID, 2*time.Hour); err != nil {
		t.Fatalf("renew while suspended: %v", err)
	}
	if _, err := s.Resume(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if out := runVia(t, ctx, dialerOf(t, c), c.Tuple, "echo ok"); strings.TrimSpace(out) != "ok" {
		t.Fatalf("after renew while suspended: %q", out)
	}
	for _, c := range made {
		dir := filepath.Join(base, "svc", "computers", c.ID)
		st := vmState(t, dir)
		if err := s.Delete(ctx, alice, c.ID); err != nil {
			t.Fatal(err)
		}
		checkGone(t, p, dir, st)
	}
}
