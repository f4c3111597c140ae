// Package vm is the VM tier's provisioner (computer/api.Provisioner): a
// computer whose receiver runs inside a QEMU guest, on the guest's own
// kernel, so a command never shares the host's kernel.
//
// The guest has no network device (-nic none). The custodian reaches the
// receiver through a unix socket on the host (DIR/wire.sock) that this
// package serves: each connection becomes one stream of a multiplexed
// link (computer/vm/muxlink) over a virtio-serial port, and the guest's
// agent joins each stream to the receiver's TLS listener on the guest's
// loopback. The mutual TLS session runs end to end, custodian to
// receiver, exactly as on a namespaced computer; no TCP port is opened
// on the host. With Config.Transport vsock the same link runs over one
// vsock connection the guest's PID 1 dials to the daemon instead of
// the port (vsock.go; docs/decisions.md "VM link over vsock").
//
// QEMU runs as a fresh unprivileged uid, in its own mount, network (no
// interface but a loopback that is down), pid, ipc and uts namespaces,
// in cgroups of its own whose memory limit is the guest's RAM plus
// OverheadBytes. The host reaches QEMU's QMP, control and wire sockets
// only through qmpinput.DialPinned (socket and directory owned by
// QEMU's uid, the peer process running as it).
//
// The guest boots from an image that holds nothing of one computer and
// is given its identity over the control port (identity.go). With
// Config.StateDir a computer starts instead from a guest saved once in
// that state (savedstate.go), and gets its identity after the restore.
package vm

import (
	"errors"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/bins"
)

// Guest facts.
const (
	// GuestRoot is the grant's root inside the guest (the tuple's root).
	GuestRoot = "/srv/tether/root"
	// GuestReceiverAddress is the receiver's TLS listener on the guest's
	// loopback; the wire port's streams are joined to it.
	GuestReceiverAddress = "127.0.0.1:7443"
	// GuestAdmission holds the admission file the host pushes (ctl admission).
	GuestAdmission = "/run/tether/admission"
	// GuestCgroup is the parent of the guest receiver's command cgroups.
	GuestCgroup = "/sys/fs/cgroup/tether"
)

// GuestAgent is PID 1 of the guest (computer/cmd/tether-vmguest), built
// static; Config.Bins must hold it beside tether-receiver.
const GuestAgent = bins.VMGuest

// Accelerators.
const (
	AccelAuto = "auto" // KVM if a probe guest boots under it, else TCG
	AccelTCG  = "tcg"
	AccelKVM  = "kvm"
)

// Transports between the host and the guest's receiver.
const (
	TransportVirtioSerial = "virtio-serial"
)

// OverheadBytes is what QEMU may use beyond the guest's RAM (its own
// heap, TCG's translation cache, bounded with tb-size, and the device
// models) before its cgroup's memory limit stops it.
const OverheadBytes = 256 << 20

// Defaults and bounds of a VM computer's resources.
const (
	DefaultMemoryBytes = 256 << 20
	MinMemoryBytes     = 128 << 20
	DefaultPids        = 256
	// qemuPids bounds QEMU's own threads on the host.
	qemuPids = 128
	// tbSizeMiB bounds TCG's translation cache.
	tbSizeMiB = 64
)

// BootTimeout bounds a guest's boot up to its receiver's first answer.
const BootTimeout = 3 * time.Minute

// Errors callers branch on.
var (
	// ErrConfig: the provisioner's configuration is incomplete.
	ErrConfig = errors.New("vm: configuration")
	// ErrGuest wraps a failure of the guest (no boot, agent silent);
	// its message carries the console's tail.
	ErrGuest = errors.New("vm: guest")
	// ErrNotAdoptable: a VM computer lives as long as the service that
	// made it (QEMU dies with it); Adopt refuses, and the service then
	// calls Destroy.
	ErrNotAdoptable = errors.New("vm: a VM computer does not outlive its service")
	// ErrLeftover: teardown found something of the computer still there.
	ErrLeftover = errors.New("vm: left over")
)

// Config says how a Provisioner makes its computers. Bins (holding
// tether-receiver and tether-vmguest, both static) is required.
type Config struct {
	Bins bins.Set
	// KernelDir is the unpacked guest kernel (computer/vm/guest.KernelAt);
	// "" means guest.KernelDir(guest.KernelVMSuite).
	KernelDir string
	// GuestImage is a ci/guestimage build's directory, booted as the
	// guest's root over a writable disk of the disk limit; "" means the
	// tether cache's current build when there is one, GuestImageOff the
	// initramfs alone. The image's digest is checked against its
	// manifest once, before the first computer.
	GuestImage string
	// QEMU is the binary; "" means qemu-system-x86_64 on PATH.
	QEMU string
	// Accel is AccelAuto (default), AccelTCG or AccelKVM.
	Accel string
	// Transport is the link's transport: TransportModeSerial (default,
	// also ""), TransportModeVsock or TransportModeAuto (vsock.go).
	Transport string
	// Owner is the owner of every tuple (default "alice").
	Owner string
	// Ops and GrantLimits are what a grant allows (defaults: every op
	// and provision.DefaultLimits); pids come from Prepare's limits.
	Ops         []admission.Op
	GrantLimits admission.Limits
	// Lease is how long a snapshot without a grant lasts (default 1 h).
	Lease time.Duration
	// CustodianUID and CustodianGID own DIR/custodian.json and the
	// custodian's credentials (default: the caller's).
	CustodianUID, CustodianGID *uint32
	// CgroupRoot is where the v1 hierarchies are mounted (default
	// /sys/fs/cgroup); QEMU's cgroups are made in its memory, pids and
	// cpuacct hierarchies.
	CgroupRoot string
	// StateDir, if set, is where saved states live: each computer then
	// starts from a state saved once, after a boot that holds nothing
	// of any computer, and is given its own identity after the restore
	// (savedstate.go). "" means every computer boots cold.
	StateDir string
	// Log, if set, receives the guest's console and the provisioner's
	// notes.
	Log func(format string, args ...any)
}
