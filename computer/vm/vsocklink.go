package vm

import (
	"context"
	"net"
	"os"

	"github.com/tetherdev/tether/computer/vm/guest"
	"github.com/tetherdev/tether/computer/vm/vmguest"
)

// vhostFD is the vhost-vsock descriptor's number in QEMU: the first of
// guest.Config.ExtraFiles.
const vhostFD = 3

// reserveCID takes a context id for the guest when the link runs over
// vsock, and notes the host's port the guest dials.
func (m *Machine) reserveCID() error {
	if !m.p.useVsock() {
		return nil
	}
	links, err := m.p.vsockLinks()
	if err != nil {
		return err
	}
	m.cid, err = links.reserve()
	m.vsockPort = links.port
	return err
}

// releaseCID gives the context id back (teardown).
func (m *Machine) releaseCID() {
	if m.cid == 0 {
		return
	}
	if links, err := m.p.vsockLinks(); err == nil {
		links.release(m.cid)
	}
}

// wireArgs is the link's device: the wire's virtio-serial port, or the
// vhost-vsock device on the descriptor qemuFiles passes.
func (m *Machine) wireArgs() []string {
	if m.cid != 0 {
		return vsockDeviceArgs(m.cid, vhostFD)
	}
	return guest.VirtioSerialPort("tether-wire", wirePortName, m.paths.guestWire)
}

// qemuFiles are the descriptors QEMU is started with: with the vsock
// link, /dev/vhost-vsock opened by the daemon (QEMU's uid has no access
// to the node). The caller closes them once QEMU started.
func (m *Machine) qemuFiles() ([]*os.File, error) {
	if m.cid == 0 {
		return nil, nil
	}
	f, err := openVhostVsock()
	if err != nil {
		return nil, err
	}
	return []*os.File{f}, nil
}

// guestWire is the guest's side of the link (vmguest.Config.Wire): the
// wire port's name, or with vsockPort (not 0) the host's port to dial.
func guestWire(vsockPort uint32) *vmguest.Wire {
	if vsockPort != 0 {
		return &vmguest.Wire{VsockPort: vsockPort, Target: GuestReceiverAddress}
	}
	return &vmguest.Wire{Port: wirePortName, Target: GuestReceiverAddress}
}

// wireModules are the guest's modules for the link over vsock (the
// virtio-serial ones are loaded anyway: control and log ports).
func wireModules(mods []string, vsockPort uint32) []string {
	if vsockPort == 0 {
		return mods
	}
	return append(append([]string{}, mods...), guest.ModulesVsock...)
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// wireLink is the link's byte stream: the wire port's socket, dialed
// with qmpinput's pins, or the one vsock connection the guest dialed
// from this computer's context id. The caller closes it.
func (m *Machine) wireLink(ctx context.Context) (net.Conn, error) {
	if m.cid == 0 {
		c, err := m.dialGuest(ctx, m.paths.guestWire)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	links, err := m.p.vsockLinks()
	if err != nil {
		return nil, err
	}
	return links.wait(ctx, m.cid, m.vm.Done())
}
