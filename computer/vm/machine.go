package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/computer/vm/guest"
	"github.com/tetherdev/tether/computer/vm/image"
	"github.com/tetherdev/tether/computer/vm/muxlink"
	"github.com/tetherdev/tether/custodian"
)

// Machine is one VM computer (api.Machine). Its methods may be called
// from several goroutines; Close must be called.
type Machine struct {
	p      *Provisioner
	paths  paths
	limits api.Limits

	alloc   provision.Allocation
	qemuUID uint32
	cg      cgroups
	kernel  guest.Kernel
	accel   guest.Accel
	creds   *provision.Credentials
	grants  *provision.Grants
	rootImg *image.Image // the guest image, or nil: the initramfs alone

	// template: this machine is booted to save the state others start
	// from (savedState); saved, if set, is the state this one starts
	// from; initramfs is the image QEMU loads either way.
	template  bool
	saved     *savedState
	initramfs string
	machineID string // the guest's /etc/machine-id, injected

	// importFrom, if set, is the disk export the writable disk is read
	// from (PrepareDisk); imported is what was read.
	importFrom io.Reader
	imported   api.Transfer

	// screen: the machine has a display and a live view (screen.go);
	// scr is its view once started.
	screen bool
	scr    *screen

	// cid is the guest's vsock context id with the vsock link (0 over
	// virtio-serial), reserved in the provisioner's vsockLinks;
	// vsockPort is the host's port its PID 1 dials.
	cid, vsockPort uint32

	vm       *guest.VM
	ctl      *ctl.Client
	wireConn net.Conn
	link     *muxlink.Link
	relay    *relay

	mu          sync.Mutex
	serviceRef  *custodian.ComputerRef
	frozen      bool // QMP stop was the last of Freeze and Thaw
	egressProxy bool // grants point at the egress proxy (egress.go)

	copyMu sync.Mutex // one copy in or out at a time (copy.go)

	closeOnce sync.Once
	closeErr  error
}

var (
	_ api.Machine      = (*Machine)(nil)
	_ api.Referrer     = (*Machine)(nil)
	_ api.RecordKeeper = (*Machine)(nil)
	_ api.Described    = (*Machine)(nil)
	_ provision.Dialer = (*Machine)(nil)
	_ api.Screen       = (*Machine)(nil)
	_ api.Attended     = (*Machine)(nil)
)

// Dir implements api.Machine.
func (m *Machine) Dir() string { return m.paths.dir }

// Tuple implements api.Machine; its root is GuestRoot.
func (m *Machine) Tuple() admission.Tuple { return m.alloc.Tuple }

// Describe implements api.Described: the tier, the accelerator and the
// transport.
func (m *Machine) Describe() api.MachineInfo {
	return api.MachineInfo{Tier: api.TierVM, Accelerator: m.accel.Name, Transport: m.p.transport()}
}

// Grant implements api.Machine: it sets the guest's clock, publishes the
// grant, pushes it to the guest and rewrites DIR/custodian.json.
func (m *Machine) Grant(ctx context.Context, notAfter time.Time) error {
	if !m.isFrozen() {
		if err := m.syncClock(ctx); err != nil {
			return err
		}
	}
	g := m.withProxyEnv(m.options().GrantFor(m.alloc.Tuple, m.alloc.UID, m.alloc.GID, notAfter))
	if err := m.publish(ctx, g); err != nil {
		return err
	}
	return m.writeCustodianConfig(g.NotAfter)
}

// Withdraw implements api.Machine: a snapshot without the grant.
func (m *Machine) Withdraw(ctx context.Context) error {
	return m.publish(ctx)
}

// KillCommands implements api.Machine: the guest kills every process of
// the grant's uid and answers once none is left.
// A stopped guest is let run for the kill (its CPUs must run for a
// signal to act) and stopped again after. With QEMU gone nothing of the
// guest runs, and there is nothing to kill.
func (m *Machine) KillCommands(ctx context.Context) error {
	if !m.alive() {
		return nil
	}
	frozen := m.isFrozen()
	if frozen {
		if err := m.Thaw(ctx); err != nil {
			return err
		}
	}
	if _, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpKillCommands}); err != nil {
		return fmt.Errorf("kill commands in the guest: %w", err)
	}
	if frozen {
		return m.Freeze(ctx)
	}
	return nil
}

// ctlTimeout bounds one control request: a guest that does not answer
// within it is broken (the control client then stays closed).
const ctlTimeout = 30 * time.Second

// ctlCall sends one control request, refusing while the guest is
// stopped (it could not answer, and a timed-out call ends the client).
func (m *Machine) ctlCall(ctx context.Context, req ctl.Request) (ctl.Response, error) {
	if m.isFrozen() {
		return ctl.Response{}, fmt.Errorf("%w: the guest is stopped (QMP stop); %s not sent", ErrGuest, req.Op)
	}
	ctx, cancel := context.WithTimeout(ctx, ctlTimeout)
	defer cancel()
	return m.ctl.Call(ctx, req)
}

func (m *Machine) isFrozen() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.frozen
}

func (m *Machine) setFrozen(f bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.frozen = f
}

// Freeze implements api.Machine as QMP stop: the whole guest stops,
// receiver included (a frozen VM computer answers nothing until Thaw).
// The guest first writes what it holds in memory to its disk (ctl sync;
// QMP stop then flushes QEMU's own caches), so a frozen computer's disk
// is whole for an export (ExportDisk). With a screen the stop goes
// through the live view (screen.go).
func (m *Machine) Freeze(ctx context.Context) error {
	if err := m.syncGuest(ctx); err != nil {
		return err
	}
	if handled, err := m.pauseScreen(ctx); handled {
		return err
	}
	if _, err := qmpExecute(ctx, m.paths.qmp, m.qemuUID, "stop"); err != nil {
		return err
	}
	m.setFrozen(true)
	return nil
}

// Thaw implements api.Machine as QMP cont, then sets the guest's clock,
// which stood still while it was stopped.
func (m *Machine) Thaw(ctx context.Context) error {
	if handled, err := m.resumeScreen(ctx); handled {
		if err != nil {
			return err
		}
		return m.syncClock(ctx)
	}
	if _, err := qmpExecute(ctx, m.paths.qmp, m.qemuUID, "cont"); err != nil {
		return err
	}
	m.setFrozen(false)
	return m.syncClock(ctx)
}

// Running asks QEMU (QMP query-status) whether the guest's CPUs run.
func (m *Machine) Running(ctx context.Context) (bool, error) {
	ret, err := qmpExecute(ctx, m.paths.qmp, m.qemuUID, "query-status")
	if err != nil {
		return false, err
	}
	var st qmpStatus
	if err := json.Unmarshal(ret, &st); err != nil {
		return false, fmt.Errorf("query-status: %w", err)
	}
	return st.Running, nil
}

// Usage implements api.Machine: QEMU's CPU time and memory from its
// cgroups on the host, and the grant's processes in the guest (none
// while the guest is stopped: they cannot run).
func (m *Machine) Usage(ctx context.Context) (api.Usage, error) {
	cpu, mem, err := m.cg.usage()
	if err != nil || m.isFrozen() {
		return api.Usage{CPUSeconds: cpu, MemoryBytes: mem}, err
	}
	resp, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpProcesses})
	if err != nil {
		return api.Usage{}, err
	}
	return api.Usage{CPUSeconds: cpu, MemoryBytes: mem, Pids: int64(len(resp.Processes))}, nil
}

// Busy implements api.Machine: whether a process of the grant's uid runs
// in the guest.
func (m *Machine) Busy(ctx context.Context) (bool, error) {
	resp, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpProcesses})
	if err != nil {
		return false, err
	}
	return len(resp.Processes) > 0, nil
}

// CustodianConfig implements api.Machine: DIR/custodian.json, written by
// the first Grant.
func (m *Machine) CustodianConfig() string { return m.paths.custConfig }

// ReceiverAlive implements api.Machine: QEMU still runs and the wire
// link to the guest holds.
func (m *Machine) ReceiverAlive() bool {
	select {
	case <-m.vm.Done():
		return false
	case <-m.link.Done():
		return false
	default:
		return true
	}
}

// Dial implements provision.Dialer: TLS through DIR/wire.sock, as the
// custodian connects, with the client certificate held in memory.
func (m *Machine) Dial(ctx context.Context) (io.ReadWriteCloser, error) {
	return m.creds.DialTLSUnix(ctx, m.paths.wire, 30*time.Second)
}

// SetServiceRef implements api.Referrer.
func (m *Machine) SetServiceRef(ref api.ServiceRef) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.serviceRef = &custodian.ComputerRef{Socket: ref.Socket, ID: ref.ID}
}

// writeCustodianConfig writes DIR/custodian.json for a lease ending at
// notAfter: TLS over DIR/wire.sock, pinned to this computer's CA.
func (m *Machine) writeCustodianConfig(notAfter time.Time) error {
	m.mu.Lock()
	ref := m.serviceRef
	m.mu.Unlock()
	a, p := m.alloc, m.paths
	cfg := custodian.Config{Tuple: a.Tuple, LeaseNotAfter: notAfter, Principal: a.Tuple.Owner,
		Receiver: m.creds.ReceiverUnix(p.wire, p.cust), StateDir: p.custState, AuditKeyFile: p.auditKey, Computer: ref}
	if err := cfg.Validate(); err != nil {
		return err
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return writeOwned(p.custConfig, append(data, '\n'), 0o600, a.CustodianUID, a.CustodianGID)
}

// KeepRecords implements api.RecordKeeper: the custodian's state and
// the audit log's public key move into dst; with a screen the view
// stops and its state (audit log) moves to dst/screen.
func (m *Machine) KeepRecords(_ context.Context, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("keep records: %w", err)
	}
	if err := m.keepScreenRecords(dst); err != nil {
		return err
	}
	for _, mv := range []struct{ from, to string }{
		{m.paths.custState, filepath.Join(dst, "state")},
		{m.paths.auditPub, filepath.Join(dst, "audit.pub")},
	} {
		if err := os.Rename(mv.from, mv.to); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("keep records: %w", err)
		}
	}
	return atomicfile.SyncDir(dst)
}

// writeOwned replaces path with data, owned by uid:gid with mode perm.
func writeOwned(path string, data []byte, perm os.FileMode, uid, gid uint32) error {
	return atomicfile.Write(path, data, perm, atomicfile.Options{Chown: true, UID: int(uid), GID: int(gid)})
}
