package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
)

// smallDisk keeps the provisioner tests' disks small.
var smallDisk = api.Limits{DiskBytes: 64 << 20}

// freezerKinds are the two freezers a computer can have, each with what
// the host must offer: cgroup2's cgroup.freeze on the computer's parent
// cgroup, and (without a cgroup2 parent) the v1 freezer hierarchy.
var freezerKinds = []struct {
	name, cgroup string
	requires     []string
}{
	{"cgroup2", CgroupRequired, []string{"root", "cgroup2", "cgroup-limits", "loop"}},
	{"v1", CgroupOff, []string{"root", "cgroup-limits", "cgroup-freezer", "loop"}},
}

// prepare makes a machine with p in a fresh directory and registers a
// Destroy of that directory, which must succeed whatever the test did.
func prepare(t *testing.T, p *Provisioner) *Machine {
	t.Helper()
	dir := filepath.Join(base(t), "computer")
	t.Cleanup(func() {
		if err := p.Destroy(context.Background(), dir); err != nil {
			t.Errorf("Destroy in cleanup: %v", err)
		}
	})
	m, err := p.Prepare(ctxT(t, 2*time.Minute), dir, smallDisk)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return m.(*Machine)
}

// TestIntegrationProvisionerLifecycle: a prepared machine admits nothing
// until Grant; a granted one runs a busy loop whose CPU time advances;
// frozen, the loop's CPU time stands still while the receiver keeps
// answering; thawed, it advances again; withdrawn, the receiver refuses
// the tuple; KillCommands on a frozen machine leaves no command and the
// machine frozen; Close of the frozen machine leaves nothing.
func TestIntegrationProvisionerLifecycle(t *testing.T) {
	for _, k := range freezerKinds {
		t.Run(k.name, func(t *testing.T) {
			testenv.Require(t, k.requires...)
			p := NewProvisioner(Config{Bins: receiverBins(t), Cgroup: k.cgroup})
			m := prepare(t, p)
			c := m.Local()
			ctx := ctxT(t, 2*time.Minute)
			checkNoGrant(t, m)
			if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
				t.Fatalf("Grant: %v", err)
			}
			if _, err := os.Stat(m.CustodianConfig()); err != nil {
				t.Fatalf("no custodian configuration after Grant: %v", err)
			}
			id, wc := startIn(t, c, "echo started; while :; do :; done")
			defer wc.Close()
			awaitOutput(t, c, wc, id, "started")
			pid := onlyProcess(t, c)
			checkFreezer(t, m, pid, func() { outputOf(t, c, wc, id) })
			checkWithdrawn(t, m, wc)
			if err := m.Freeze(ctx); err != nil {
				t.Fatalf("Freeze before the kill: %v", err)
			}
			if err := m.KillCommands(ctx); err != nil {
				t.Fatalf("KillCommands on a frozen machine: %v", err)
			}
			if busy, err := m.Busy(ctx); busy || err != nil {
				t.Fatalf("Busy after KillCommands = %v, %v", busy, err)
			}
			if !c.Frozen() || !m.ReceiverAlive() {
				t.Fatalf("after KillCommands: frozen %v, receiver alive %v; want both", c.Frozen(), m.ReceiverAlive())
			}
			s := c.State()
			if err := m.Close(context.Background()); err != nil {
				t.Fatalf("Close of a frozen machine: %v", err)
			}
			if err := NothingLeft(s); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// checkNoGrant: a prepared machine's receiver answers, but refuses the
// tuple (not_admitted), and there is no custodian configuration yet.
func checkNoGrant(t *testing.T, m *Machine) {
	t.Helper()
	if !m.ReceiverAlive() {
		t.Fatal("the prepared machine's receiver is not running")
	}
	_, err := AttachVia(ctxT(t, time.Minute), m.Local(), m.Tuple())
	wantCode(t, err, errcode.CodeNotAdmitted)
	if _, err := os.Lstat(m.CustodianConfig()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("custodian configuration before any grant: %v", err)
	}
}

// checkFreezer: the busy loop pid uses CPU while thawed (the positive
// control), uses none while frozen although the receiver answers ask
// all the while, and uses CPU again once thawed.
func checkFreezer(t *testing.T, m *Machine, pid int, ask func()) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	start := time.Now()
	advanced := awaitCPU(t, pid, cpuTicks(t, pid)+5)
	window := max(3*time.Since(start), 500*time.Millisecond)
	if err := m.Freeze(ctx); err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	frozen := cpuTicks(t, pid)
	answers := 0
	for end := time.Now().Add(window); time.Now().Before(end); answers++ {
		ask() // fails the test if the receiver does not answer
		if _, err := AttachVia(ctx, m.Local(), m.Tuple()); err != nil {
			t.Fatalf("attach while frozen: %v", err)
		}
	}
	if after := cpuTicks(t, pid); after != frozen {
		t.Fatalf("frozen loop used CPU: %d ticks became %d over %s", frozen, after, window)
	}
	u, err := m.Usage(ctx)
	if err != nil || u.Pids < 1 || u.CPUSeconds < float64(advanced)/100 || u.MemoryBytes <= 0 {
		t.Fatalf("Usage while frozen = %+v, %v; want the loop's pid, CPU time and memory", u, err)
	}
	if err := m.Thaw(ctx); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	awaitCPU(t, pid, frozen+5)
	t.Logf("frozen for %s: 0 ticks, %d receiver round trips; usage %+v", window, answers, u)
}

// checkWithdrawn: after Withdraw the receiver refuses the tuple.
func checkWithdrawn(t *testing.T, m *Machine, wc wireCaller) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	if err := m.Withdraw(ctx); err != nil {
		t.Fatalf("Withdraw: %v", err)
	}
	var r wire.ExecOutputResult
	err := wc.Call(ctx, wire.OpExecOutput, m.Tuple().SHA256(), opKey(), time.Now().Add(time.Minute),
		wire.TerminalArgs{TerminalID: "t-0"}, &r)
	wantCode(t, err, errcode.CodeNotAdmitted)
}

// onlyProcess returns the host pid of the one process running as the
// computer's uid.
func onlyProcess(t *testing.T, c *Local) int {
	t.Helper()
	ps, err := ProcessesOf(c.State().UID)
	if err != nil || len(ps) != 1 {
		t.Fatalf("processes of the computer: %+v %v; want one", ps, err)
	}
	return ps[0].HostPID
}

// cpuTicks is utime+stime of pid (fields 14 and 15 of /proc/PID/stat).
func cpuTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat %q", pid, b)
	}
	return u + s
}

// awaitCPU waits (at most 30 s) until pid has used at least want ticks.
func awaitCPU(t *testing.T, pid int, want uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got := cpuTicks(t, pid); got >= want {
			return got
		} else if time.Now().After(deadline) {
			t.Fatalf("pid %d used %d CPU ticks, never %d", pid, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIntegrationProvisionerAdopt: a machine whose Machine value was
// dropped is adopted again from its directory: the receiver, the grant,
// the running command are still there, a command runs through the
// custodian's credentials read back from disk, and a grant published by
// the adopter (with the key read back) is honoured.
func TestIntegrationProvisionerAdopt(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	p := NewProvisioner(Config{Bins: receiverBins(t)})
	ctx := ctxT(t, 2*time.Minute)
	first := prepare(t, p)
	if err := first.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	id, wc := startIn(t, first.Local(), "echo started; sleep 300")
	awaitOutput(t, first.Local(), wc, id, "started")
	wc.Close()
	dir, tuple := first.Dir(), first.Tuple()
	first = nil // dropped: only the directory is left to find it by

	got, err := p.Adopt(ctx, dir)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	m := got.(*Machine)
	if !m.Tuple().Equal(tuple) || !m.ReceiverAlive() {
		t.Fatalf("adopted tuple %+v (want %+v), receiver alive %v", m.Tuple(), tuple, m.ReceiverAlive())
	}
	if busy, err := m.Busy(ctx); !busy || err != nil {
		t.Fatalf("Busy of the adopted machine = %v, %v; the sleep runs", busy, err)
	}
	if r := runIn(t, m.Local(), "echo adopted"); r.out != "adopted\n" {
		t.Fatalf("command on the adopted machine: %v", r)
	}
	if err := m.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = AttachVia(ctx, m.Local(), tuple)
	wantCode(t, err, errcode.CodeNotAdmitted)
	if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("Grant by the adopter: %v", err)
	}
	if _, err := AttachVia(ctx, m.Local(), tuple); err != nil {
		t.Fatalf("attach after the adopter's grant: %v", err)
	}
	s := m.Local().State()
	if err := m.Close(ctx); err != nil {
		t.Fatalf("Close of the adopted machine: %v", err)
	}
	if err := NothingLeft(s); err != nil {
		t.Fatal(err)
	}
}

// TestIntegrationProvisionerDestroyDeadReceiver: when a machine's
// receiver was SIGKILLed, Adopt refuses it (ErrReceiverExited) and
// changes nothing; Destroy then leaves nothing, and a second Destroy of
// the gone directory succeeds.
func TestIntegrationProvisionerDestroyDeadReceiver(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	p := NewProvisioner(Config{Bins: receiverBins(t)})
	ctx := ctxT(t, 2*time.Minute)
	m := prepare(t, p)
	if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	id, wc := startIn(t, m.Local(), "ipcmk -M 4096 && echo started; sleep 300")
	awaitOutput(t, m.Local(), wc, id, "started")
	wc.Close()
	s := m.Local().State()
	if err := syscall.Kill(s.ReceiverPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return !m.ReceiverAlive() })
	if _, err := p.Adopt(ctx, s.Dir); !errors.Is(err, ErrReceiverExited) {
		t.Fatalf("Adopt with a dead receiver: %v, want ErrReceiverExited", err)
	}
	if _, err := ReadState(s.Dir); err != nil {
		t.Fatalf("the refused Adopt changed the directory: %v", err)
	}
	if err := p.Destroy(ctx, s.Dir); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := NothingLeft(s); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, s.Dir); err != nil {
		t.Fatalf("Destroy of a destroyed directory: %v", err)
	}
}
