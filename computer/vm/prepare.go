package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/bins"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/vm/guest"
	"github.com/tetherdev/tether/computer/vm/vmguest"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/receiver"
)

// Guest paths of the files the image carries.
const (
	guestAgentPath    = "/sbin/tether-vmguest"
	guestReceiverPath = "/usr/bin/tether-receiver"
	guestEtc          = "/etc/tether"
	wirePortName      = "tether.wire"
)

// guestRecv are the receiver's certificate, key and issuer in the image.
var guestRecv = provision.ReceiverFilesIn(guestEtc)

// prepare runs the named steps of one Prepare; teardown runs on failure.
func (m *Machine) prepare(ctx context.Context) error {
	steps := []provision.Step{
		{Name: "validate.Limits", Run: m.validate},
		{Name: "guest.RootImage", Run: m.chooseRoot},
		{Name: "allocate.IDs", Run: m.allocate},
		{Name: "layout.Directories", Run: m.makeLayout},
		{Name: "pki.Certificates", Run: m.makePKI},
		{Name: "admission.Key", Run: m.makeSigningKey},
		{Name: "guest.Image", Run: m.chooseImage},
		{Name: "guest.Disk", Run: m.makeDisk},
		{Name: "qemu.Cgroups", Run: m.makeCgroups},
		{Name: "qemu.Boot", Run: m.boot},
		{Name: "guest.Clock", Run: m.syncClock},
		{Name: "guest.Identity", Run: m.inject},
		{Name: "wire.Link", Run: m.startWire},
		{Name: "receiver.Answering", Run: m.waitAnswering},
	}
	if m.screen {
		steps = append(steps, provision.Step{Name: "screen.View", Run: m.startScreen})
	}
	return provision.RunSteps(ctx, "vm", steps, m.teardown, 30*time.Second)
}

// validate resolves the limits: memory becomes the guest's RAM, pids the
// grant's bound inside the guest.
func (m *Machine) validate(context.Context) error {
	if _, err := m.p.Transport(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: a VM computer's QEMU runs as its own uid: the provisioner must be root", ErrConfig)
	}
	if err := m.p.cfg.Bins.Require(bins.Receiver, GuestAgent); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	l := &m.limits
	if l.MemoryBytes == 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	if l.MemoryBytes < MinMemoryBytes {
		return fmt.Errorf("%w: memory %d bytes is below a VM computer's floor of %d", provision.ErrOptions, l.MemoryBytes, MinMemoryBytes)
	}
	if l.Pids == 0 {
		l.Pids = DefaultPids
	}
	return nil
}

// rootBytes is what the grant's root may hold: with a guest image, the
// writable disk's size (the root lives on it); without, the size of the
// root's tmpfs in the guest: the disk limit, at most half the guest's
// RAM (the root then lives in that RAM).
func (m *Machine) rootBytes() int64 {
	if m.rootImg != nil {
		return m.limits.DiskBytes
	}
	half := m.limits.MemoryBytes / 2
	if d := m.limits.DiskBytes; d > 0 && d < half {
		return d
	}
	return half
}

// allocate picks the grant's uid and tuple, and a second fresh uid for
// QEMU itself.
func (m *Machine) allocate(context.Context) error {
	var err error
	if m.alloc, err = provision.Allocate(m.options(), "vm", "qemu", GuestRoot); err != nil {
		return err
	}
	for m.qemuUID == 0 || m.qemuUID == m.alloc.UID {
		if m.qemuUID, err = provision.FreshID(); err != nil {
			return err
		}
	}
	m.cg = cgroups{root: m.p.cgroupRoot(), name: "tether-vm-" + strings.TrimPrefix(m.alloc.Tuple.Sandbox, "vm-")}
	return m.reserveCID()
}

// options are the provision.Options a grant of this computer follows.
func (m *Machine) options() provision.Options {
	c := m.p.cfg
	o := provision.Options{Owner: c.Owner, Ops: c.Ops, Limits: c.GrantLimits, Lease: c.Lease,
		CustodianUID: c.CustodianUID, CustodianGID: c.CustodianGID}
	o.Limits.MaxPids, o.Limits.MaxMemoryBytes, o.Limits.MaxDiskBytes = m.limits.Pids, m.limits.MemoryBytes, m.rootBytes()
	if o.Owner == "" {
		o.Owner = "alice"
	}
	if o.Ops == nil {
		o.Ops = provision.AllOps
	}
	if o.Lease == 0 {
		o.Lease = time.Hour
	}
	return o
}

func (m *Machine) makeLayout(context.Context) error {
	p, a := m.paths, m.alloc
	if err := provision.MakeDirs(
		provision.Dir{Path: p.dir, Mode: 0o755},
		provision.Dir{Path: p.custodian, Mode: 0o700, UID: a.CustodianUID, GID: a.CustodianGID},
		provision.Dir{Path: p.coordinator, Mode: 0o700},
		provision.Dir{Path: p.admission, Mode: 0o755},
		provision.Dir{Path: p.qemu, Mode: 0o700, UID: m.qemuUID, GID: m.qemuUID},
	); err != nil {
		return err
	}
	return p.writeState(state{QEMUUID: m.qemuUID, Cgroup: m.cg.name, UID: a.UID, VsockCID: m.cid})
}

// makePKI mints this computer's CA, the receiver's certificate (baked
// into the image) and the custodian's, and the custodian's audit key.
func (m *Machine) makePKI(context.Context) error {
	a := m.alloc
	var err error
	if m.creds, err = provision.NewCredentials("tether vm computer "+a.Tuple.Allocation, a.Tuple.Owner); err != nil {
		return err
	}
	if err := m.creds.WriteCustodian(m.paths.cust, a.CustodianUID, a.CustodianGID); err != nil {
		return err
	}
	skey, vkey, err := audit.GenerateKey("tether.vm/" + a.Tuple.Allocation)
	if err != nil {
		return err
	}
	if err := writeOwned(m.paths.auditKey, []byte(skey+"\n"), 0o600, a.CustodianUID, a.CustodianGID); err != nil {
		return err
	}
	return writeOwned(m.paths.auditPub, []byte(vkey+"\n"), 0o644, a.CustodianUID, a.CustodianGID)
}

func (m *Machine) makeSigningKey(context.Context) error {
	var err error
	m.grants, err = provision.NewGrants(m.alloc.Tuple, m.options().Lease, m.paths.coord)
	return err
}

// chooseImage finds the kernel and writes the guest's initramfs for a
// cold boot, or, with Config.StateDir, makes sure the saved state exists
// and boots from it.
func (m *Machine) chooseImage(ctx context.Context) error {
	k, err := m.p.kernel()
	if err != nil {
		return err
	}
	m.kernel = k
	if m.p.cfg.StateDir != "" && !m.template && !m.screen && m.importFrom == nil {
		m.saved, err = m.p.savedState(ctx, m.limits, m.rootImg)
		if err != nil {
			return fmt.Errorf("saved state: %w", err)
		}
		m.initramfs = m.saved.initramfs
		return nil
	}
	m.initramfs = m.paths.initramfs
	if err := buildGenericImage(ctx, m.p.cfg.Bins, k, m.paths.initramfs, m.rootImageConfig(), m.screen, m.vsockPort); err != nil {
		return err
	}
	return os.Chown(m.paths.initramfs, int(m.qemuUID), int(m.qemuUID))
}

// buildGenericImage writes an initramfs that holds nothing of one
// computer: the agent, the receiver and the agent's configuration, which
// makes the agent wait for its identity (inject). With screen it also
// loads the display's and the tablet's modules, and the agent draws its
// console on the display (vmguest.Config.Screen). With vsockPort (not 0)
// the guest dials its link to that host vsock port (guestWire) instead
// of opening the wire port.
func buildGenericImage(ctx context.Context, b bins.Set, k guest.Kernel, out string, root *vmguest.RootImage, screen bool, vsockPort uint32) error {
	agentCfg, err := json.MarshalIndent(vmguest.Config{Hostname: "tether-vm", Shares: []vmguest.Share{},
		Root: GuestRoot, Receiver: []string{guestReceiverPath, "--config", guestEtc + "/receiver.json"},
		CgroupParent: GuestCgroup, Wire: guestWire(vsockPort),
		AwaitIdentity: true, AdmissionFile: GuestAdmission + "/" + admission.FileName, RootImage: root, Screen: screen}, "", "  ")
	if err != nil {
		return err
	}
	files := []guest.File{
		{Path: vmguest.ConfigPath, Data: agentCfg, Mode: 0o600},
		{Path: "/etc/hostname", Data: []byte("tether-vm\n"), Mode: 0o644},
		{Path: guestAgentPath, Source: b.Path(GuestAgent), Mode: 0o755},
		{Path: guestReceiverPath, Source: b.Path(bins.Receiver), Mode: 0o755},
	}
	mods := wireModules(guestModules(root), vsockPort)
	if screen {
		mods = append(append([]string{}, mods...), screenModules...)
	}
	_, err = guest.Build(ctx, guest.Spec{Kernel: k, Modules: mods, Files: files, Init: guestAgentPath}, out)
	return err
}

// identityFiles are the files that make the guest's receiver this
// computer's: its configuration, certificate, key and issuer, and the
// admission key.
func (m *Machine) identityFiles() ([]guest.File, error) {
	keyPEM, err := m.creds.Server.KeyPEM()
	if err != nil {
		return nil, err
	}
	pub, err := os.ReadFile(m.paths.coord.PublicKey)
	if err != nil {
		return nil, err
	}
	landlock := receiver.LandlockOff
	if kernelAtLeast(m.kernel.Version, 6, 12) { // Landlock ABI 6, the receiver's minimum
		landlock = receiver.LandlockRequired
	}
	recvCfg, err := provision.ReceiverConfig(provision.ReceiverSettings{
		Listen:        m.creds.ListenTLS(GuestReceiverAddress, guestRecv),
		AdmissionFile: GuestAdmission + "/" + admission.FileName, PublicKey: guestEtc + "/admission.pub",
		Landlock: guestLandlock(landlock), // egress.go
		Cgroup:   receiver.CgroupConfig{Mode: receiver.CgroupRequired, Parent: GuestCgroup}, FenceState: guestEtc + "/fence.json"})
	if err != nil {
		return nil, err
	}
	return []guest.File{
		{Path: guestEtc + "/receiver.json", Data: recvCfg, Mode: 0o600},
		{Path: guestRecv.Cert, Data: m.creds.Server.CertPEM(), Mode: 0o644},
		{Path: guestRecv.Key, Data: keyPEM, Mode: 0o600},
		{Path: guestRecv.CA, Data: m.creds.CA.CertPEM(), Mode: 0o644},
		{Path: guestEtc + "/admission.pub", Data: pub, Mode: 0o644},
	}, nil
}

func (m *Machine) makeCgroups(context.Context) error {
	return m.cg.make(m.limits.MemoryBytes + OverheadBytes)
}

// kernelAtLeast reports whether the release "6.12.95+deb12-amd64" is at
// least major.minor.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}
