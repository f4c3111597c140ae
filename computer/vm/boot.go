package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/computer/vm/guest"
	"github.com/tetherdev/tether/computer/vm/muxlink"
	"github.com/tetherdev/tether/computer/vm/vmguest"
	"github.com/tetherdev/tether/qmpinput"
)

// confinement is QEMU's process attributes: its own uid and gid with no
// supplementary group (but /dev/kvm's group under KVM), its own mount,
// network, pid, ipc and uts namespaces (the network one holds only a
// loopback that is down: no route anywhere), a process group of its own,
// and SIGKILL when the provisioner's thread dies.
func (m *Machine) confinement() *syscall.SysProcAttr {
	groups := []uint32{}
	if m.accel.Name == AccelKVM {
		var st syscall.Stat_t
		if syscall.Stat("/dev/kvm", &st) == nil {
			groups = append(groups, st.Gid)
		}
	}
	return &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Credential: &syscall.Credential{Uid: m.qemuUID, Gid: m.qemuUID, Groups: groups},
		Setpgid:    true, Pdeathsig: syscall.SIGKILL,
	}
}

// qemuArgs are the guest's only devices: the control, log and wire
// ports and QMP; no network device and no share (a 9p export would
// block migration, and so the saved state: the admission snapshot is
// pushed over the control port instead).
func (m *Machine) qemuArgs() []string {
	p := m.paths
	return slices.Concat(
		[]string{"-nic", "none"},
		guest.QMPSocket(p.qmp),
		guest.VirtioSerialBus(),
		guest.VirtioSerialPort("tether-ctl", vmguest.ControlPort, p.control),
		m.wireArgs(),
		[]string{"-chardev", "file,id=tether-log,path=" + p.receiverLog,
			"-device", "virtserialport,chardev=tether-log,name=" + vmguest.LogPort},
		m.diskArgs(),
		m.screenArgs(),
	)
}

// boot starts QEMU confined, places it in its cgroups, and connects the
// control port once the guest's agent answers.
func (m *Machine) boot(ctx context.Context) error {
	accel, err := m.p.chooseAccel(ctx, m.kernel)
	if err != nil {
		return err
	}
	m.accel = accel
	accelArg := accel.Name
	if accelArg == AccelTCG {
		accelArg = fmt.Sprintf("tcg,tb-size=%d", tbSizeMiB)
	}
	args := m.qemuArgs()
	if m.saved != nil {
		args = append(args, m.saved.incoming()...)
	}
	extra, err := m.qemuFiles()
	if err != nil {
		return err
	}
	m.vm, err = guest.Start(ctx, guest.Config{Kernel: m.kernel, Initramfs: m.initramfs, QEMU: m.p.cfg.QEMU,
		Accel: accelArg, CPUs: 1, MemoryMiB: int(m.limits.MemoryBytes >> 20), Args: args, Append: m.screenAppend(),
		ConsoleLog: m.p.consoleWriter(), SysProcAttr: m.confinement(), ExtraFiles: extra})
	closeAll(extra) // QEMU holds its own copies
	if err != nil {
		return err
	}
	// WARNING: QEMU runs for the moment between its start and this write
	// outside its cgroups (v1 has no CLONE_INTO_CGROUP); it has not
	// touched the guest's RAM yet.
	if err := m.cg.enter(m.vm.PID()); err != nil {
		return err
	}
	if err := m.paths.writeState(state{QEMUUID: m.qemuUID, QEMUPID: m.vm.PID(), Cgroup: m.cg.name, UID: m.alloc.UID, VsockCID: m.cid}); err != nil {
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, BootTimeout)
	defer cancel()
	if m.saved != nil {
		if err := m.resume(bctx); err != nil {
			return m.guestError(err)
		}
	}
	c, err := m.dialGuest(bctx, m.paths.control)
	if err != nil {
		return m.guestError(err)
	}
	m.ctl = ctl.NewClient(c)
	if _, err := m.ctl.Call(bctx, ctl.Request{Op: ctl.OpStatus}); err != nil {
		return m.guestError(err)
	}
	return nil
}

// dialGuest connects to one of QEMU's sockets with qmpinput's pins (the
// socket and its directory QEMU's uid's, the peer running as it), once
// QEMU has made it.
func (m *Machine) dialGuest(ctx context.Context, path string) (*net.UnixConn, error) {
	for {
		c, err := qmpinput.DialPinned(ctx, path, m.qemuUID)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w (last: %v)", path, ctx.Err(), err)
		case <-m.vm.Done():
			return nil, fmt.Errorf("%w: QEMU exited before %s answered", ErrGuest, path)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startWire connects the wire port, starts the link and serves
// DIR/wire.sock for the custodian.
func (m *Machine) startWire(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(ctx, BootTimeout)
	defer cancel()
	c, err := m.wireLink(bctx)
	if err != nil {
		return m.guestError(err)
	}
	m.wireConn = c
	if m.link, err = muxlink.Host(bctx, c); err != nil {
		return m.guestError(err)
	}
	m.relay, err = listenRelay(m.paths.wire, m.link, m.alloc.CustodianGID)
	return err
}

// guestError wraps err in ErrGuest with the console's tail.
func (m *Machine) guestError(err error) error {
	lines := m.vm.Lines()
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return fmt.Errorf("%w: %w\n--- console tail ---\n%s", ErrGuest, err, strings.Join(lines, "\n"))
}

// MaxClockSkew bounds the guest's clock against the host's after a sync.
const MaxClockSkew = 250 * time.Millisecond

// syncClock sets the guest's clock to the host's (grants expire to the
// second; TCG drifts).
func (m *Machine) syncClock(ctx context.Context) error {
	sent := time.Now()
	resp, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpSetClock, UnixNano: sent.UnixNano()})
	if err != nil {
		return fmt.Errorf("sync the guest's clock: %w", err)
	}
	g := time.Unix(0, resp.UnixNano)
	if g.Before(sent.Add(-MaxClockSkew)) || g.After(time.Now().Add(MaxClockSkew)) {
		return fmt.Errorf("%w: after setting its clock the guest reads %s", ErrGuest, g.Format(time.RFC3339Nano))
	}
	return nil
}

// waitAnswering waits until the receiver answers an attach through the
// wire socket at all; with no grant yet it refuses (not_admitted).
func (m *Machine) waitAnswering(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, BootTimeout)
	defer cancel()
	var last error
	for {
		_, last = provision.AttachVia(ctx, m, m.alloc.Tuple)
		if last == nil || errors.Is(last, &errcode.Error{Code: errcode.CodeNotAdmitted}) {
			return nil
		}
		select {
		case <-ctx.Done():
			return m.guestError(fmt.Errorf("receiver did not answer: %w (last: %v)\n--- receiver log ---\n%s", ctx.Err(), last, m.receiverLog()))
		case <-m.vm.Done():
			return m.guestError(errors.New("QEMU exited"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// receiverLog is the guest receiver's log so far (at most 4 KiB of its
// end).
func (m *Machine) receiverLog() string {
	b, err := os.ReadFile(m.paths.receiverLog)
	if err != nil {
		return ""
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}
