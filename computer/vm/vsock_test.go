package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/vsock"

	"github.com/tetherdev/tether/computer/vm/muxlink"
	"github.com/tetherdev/tether/computer/vm/vmguest"
)

// fakeVsockListener stands in for mdlayher/vsock's listener (no vsock
// to a guest exists on the machines that run these tests): Accept hands
// out the connections a test dials, each with the peer context id the
// hypervisor would report. It has no other method to call.
type fakeVsockListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

var _ linkListener = (*fakeVsockListener)(nil)

func newFakeVsockListener() *fakeVsockListener {
	return &fakeVsockListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (f *fakeVsockListener) Accept() (net.Conn, error) {
	select {
	case c := <-f.conns:
		return c, nil
	case <-f.closed:
		return nil, net.ErrClosed
	}
}

func (f *fakeVsockListener) Close() error {
	f.once.Do(func() { close(f.closed) })
	return nil
}

// dial connects as a guest of context id cid (addr overrides the
// address, for a peer that is not vsock at all) and returns the guest's
// end.
func (f *fakeVsockListener) dial(t *testing.T, cid uint32, addr net.Addr) net.Conn {
	t.Helper()
	host, guest := net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	if addr == nil {
		addr = &vsock.Addr{ContextID: cid, Port: 49152}
	}
	select {
	case f.conns <- peerConn{Conn: host, remote: addr}:
	case <-time.After(10 * time.Second):
		t.Fatal("the links did not accept")
	}
	return guest
}

// peerConn is a connection whose peer address the hypervisor vouched for.
type peerConn struct {
	net.Conn
	remote net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.remote }

// logLines collects what vsockLinks logs.
type logLines struct {
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

func newLogLines() *logLines { return &logLines{added: make(chan struct{}, 64)} }

func (l *logLines) logf(format string, a ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, a...))
	l.mu.Unlock()
	l.added <- struct{}{}
}

// waitLine waits for the next logged line and returns it.
func (l *logLines) waitLine(t *testing.T) string {
	t.Helper()
	select {
	case <-l.added:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing logged")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines[len(l.lines)-1]
}

// refusedConn waits until the links closed the guest's end of c.
func refusedConn(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the refused connection reads %v, want end-of-file (closed by the host)", err)
	}
}

// TestVsockLinksTakeOnlyTheComputersCID: the host takes a link only from
// the context id a computer reserved, once. Refused and logged: a peer
// of another context id, a peer that is not a vsock address, and a
// second connection from the computer's own context id (a command in
// the guest dialing after PID 1). Positive control: the computer's
// first connection is its link.
func TestVsockLinksTakeOnlyTheComputersCID(t *testing.T) {
	ln, log := newFakeVsockListener(), newLogLines()
	links := newVsockLinks(ln, LinkVsockPort, log.logf)
	defer links.Close()
	cid, err := links.reserve()
	if err != nil || cid < minGuestCID {
		t.Fatalf("reserve = %d, %v", cid, err)
	}

	refusedConn(t, ln.dial(t, cid+1, nil))
	if l := log.waitLine(t); !strings.Contains(l, fmt.Sprintf("context id %d is no computer's", cid+1)) {
		t.Fatalf("log: %q", l)
	}
	refusedConn(t, ln.dial(t, cid, &net.UnixAddr{Name: "@x", Net: "unix"}))
	if l := log.waitLine(t); !strings.Contains(l, "not a vsock address") {
		t.Fatalf("log: %q", l)
	}

	first := ln.dial(t, cid, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := links.wait(ctx, cid, nil)
	if err != nil {
		t.Fatalf("control: the computer's own first connection: %v", err)
	}
	go func() { _, _ = first.Write([]byte("x")) }()
	if _, err := io.ReadFull(got, make([]byte, 1)); err != nil {
		t.Fatalf("the link delivered is not the guest's connection: %v", err)
	}

	refusedConn(t, ln.dial(t, cid, nil))
	if l := log.waitLine(t); !strings.Contains(l, fmt.Sprintf("context id %d already has its link", cid)) {
		t.Fatalf("log: %q", l)
	}

	links.release(cid)
	refusedConn(t, ln.dial(t, cid, nil))
	if l := log.waitLine(t); !strings.Contains(l, "is no computer's") {
		t.Fatalf("after release: %q", l)
	}
}

// TestVsockLinksWaitEnds: a wait ends when QEMU is gone, the context
// ends or the listener closes; an unreserved id is refused at once.
func TestVsockLinksWaitEnds(t *testing.T) {
	links := newVsockLinks(newFakeVsockListener(), LinkVsockPort, nil)
	cid, err := links.reserve()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := links.wait(context.Background(), cid+1, nil); !errors.Is(err, ErrVsock) {
		t.Fatalf("unreserved: %v", err)
	}
	gone := make(chan struct{})
	close(gone)
	if _, err := links.wait(context.Background(), cid, gone); !errors.Is(err, ErrGuest) {
		t.Fatalf("QEMU gone: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := links.wait(ctx, cid, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	links.Close()
	if err := links.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := links.wait(context.Background(), cid, nil); !errors.Is(err, ErrVsock) {
		t.Fatalf("closed: %v", err)
	}
}

// TestVsockReserveIsUnique: reserved context ids are at least 3, below
// VMADDR_CID_ANY and distinct.
func TestVsockReserveIsUnique(t *testing.T) {
	links := newVsockLinks(newFakeVsockListener(), LinkVsockPort, nil)
	defer links.Close()
	seen := map[uint32]bool{}
	for range 1000 {
		cid, err := links.reserve()
		if err != nil || cid < minGuestCID || cid == 0xffffffff || seen[cid] {
			t.Fatalf("reserve = %d, %v (seen %v)", cid, err, seen[cid])
		}
		seen[cid] = true
	}
}

// TestMuxlinkOverVsockLink: the link runs over the connection the host
// took exactly as over the virtio-serial port: the nonce handshake, a
// stream the host opens and one the guest dials (egress).
func TestMuxlinkOverVsockLink(t *testing.T) {
	ln := newFakeVsockListener()
	links := newVsockLinks(ln, LinkVsockPort, nil)
	defer links.Close()
	cid, err := links.reserve()
	if err != nil {
		t.Fatal(err)
	}
	guestConn := ln.dial(t, cid, nil)
	guest := muxlink.GuestConn(guestConn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := links.wait(ctx, cid, nil)
	if err != nil {
		t.Fatal(err)
	}
	host, err := muxlink.Host(ctx, c)
	if err != nil {
		t.Fatalf("handshake over the vsock link: %v", err)
	}
	go func() {
		s, err := guest.Accept(ctx)
		if err == nil {
			_, _ = io.Copy(s, s)
			s.Close()
		}
	}()
	s, err := host.Open()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	host.SetDialable(true)
	gs, err := guest.Dial()
	if err != nil {
		t.Fatalf("guest dial: %v", err)
	}
	defer gs.Close()
	hs, err := host.Accept(ctx)
	if err != nil {
		t.Fatalf("host accept of the guest's stream: %v", err)
	}
	defer hs.Close()
	c.Close()
	select {
	case <-guest.Done():
	case <-ctx.Done():
		t.Fatal("the guest's link outlived the host's connection")
	}
}

// withoutVhost makes openVhostVsock fail as on a host without the
// device (as this project's CI hosts are).
func withoutVhost(t *testing.T) {
	t.Helper()
	old := openVhostVsock
	openVhostVsock = func() (*os.File, error) {
		return nil, &os.PathError{Op: "open", Path: VhostVsockDevice, Err: syscall.ENOENT}
	}
	t.Cleanup(func() { openVhostVsock = old })
}

// withVhost makes openVhostVsock open name instead of the device.
func withVhost(t *testing.T, name string) {
	t.Helper()
	old := openVhostVsock
	openVhostVsock = func() (*os.File, error) { return os.OpenFile(name, os.O_RDWR, 0) }
	t.Cleanup(func() { openVhostVsock = old })
}

// TestChooseTransport: serial is the default; vsock where the device
// does not open fails naming it; auto then falls back to serial and
// says why. Positive control: where the device opens (here /dev/null
// stands in for it) vsock and auto choose vsock; saved states refuse
// vsock (auto: serial).
func TestChooseTransport(t *testing.T) {
	withoutVhost(t)
	for _, mode := range []string{"", TransportModeSerial} {
		if tr, err := ChooseTransport(mode, ""); err != nil || tr.Name != TransportVirtioSerial {
			t.Fatalf("%q: %v %v", mode, tr, err)
		}
	}
	_, err := ChooseTransport(TransportModeVsock, "")
	if !errors.Is(err, ErrVsock) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), VhostVsockDevice) {
		t.Fatalf("vsock without the device: %v", err)
	}
	tr, err := ChooseTransport(TransportModeAuto, "")
	if err != nil || tr.Name != TransportVirtioSerial || !strings.Contains(tr.Reason, VhostVsockDevice) {
		t.Fatalf("auto without the device: %v %v", tr, err)
	}
	if _, err := ChooseTransport("tcp", ""); !errors.Is(err, ErrVsock) {
		t.Fatalf("unknown mode: %v", err)
	}

	withVhost(t, os.DevNull)
	for _, mode := range []string{TransportModeVsock, TransportModeAuto} {
		if tr, err := ChooseTransport(mode, ""); err != nil || tr.Name != TransportVsock {
			t.Fatalf("control %q: %v %v", mode, tr, err)
		}
	}
	if _, err := ChooseTransport(TransportModeVsock, "/var/lib/states"); !errors.Is(err, ErrVsock) {
		t.Fatalf("vsock with saved states: %v", err)
	}
	if tr, _ := ChooseTransport(TransportModeAuto, "/var/lib/states"); tr.Name != TransportVirtioSerial {
		t.Fatalf("auto with saved states: %v", tr)
	}
}

// TestProvisionerRefusesVsockWithoutDevice: a provisioner told vsock on
// a host without the device names the failed check in Transport and in
// what it reports; Prepare's first step fails with it.
func TestProvisionerRefusesVsockWithoutDevice(t *testing.T) {
	withoutVhost(t)
	p := NewProvisioner(Config{Transport: TransportModeVsock})
	if _, err := p.Transport(); !errors.Is(err, ErrVsock) {
		t.Fatalf("Transport: %v", err)
	}
	m := &Machine{p: p}
	if err := m.validate(context.Background()); !errors.Is(err, ErrVsock) {
		t.Fatalf("validate: %v", err)
	}
	if s := p.transport(); !strings.Contains(s, VhostVsockDevice) {
		t.Fatalf("transport: %q", s)
	}
}

// TestQEMUArgsVsock: with the vsock link the guest gets the vhost-vsock
// device with its context id on descriptor 3 (the daemon's open of the
// device, QEMU's first extra file) and no wire port; over virtio-serial
// the wire port and no vsock device. The guest's configuration follows.
func TestQEMUArgsVsock(t *testing.T) {
	withVhost(t, os.DevNull)
	p := NewProvisioner(Config{Transport: TransportModeVsock})
	m := &Machine{p: p, paths: layout(t.TempDir()), cid: 1234, vsockPort: LinkVsockPort - 1}
	args := m.qemuArgs()
	if !slices.Contains(args, "vhost-vsock-pci,id=tether-vsock,guest-cid=1234,vhostfd=3") {
		t.Fatalf("no vhost-vsock device: %q", args)
	}
	if strings.Contains(strings.Join(args, " "), wirePortName) {
		t.Fatalf("a wire port beside vsock: %q", args)
	}
	files, err := m.qemuFiles()
	if err != nil || len(files) != 1 || vhostFD != 3 {
		t.Fatalf("qemuFiles = %v, %v", files, err)
	}
	closeAll(files)
	if w := guestWire(m.vsockPort); w.VsockPort != LinkVsockPort-1 || w.Port != "" {
		t.Fatalf("guest wire: %+v", w)
	}
	if mods := wireModules(nil, m.vsockPort); !slices.Contains(mods, "vmw_vsock_virtio_transport") {
		t.Fatalf("modules: %q", mods)
	}

	serial := &Machine{p: NewProvisioner(Config{}), paths: layout(t.TempDir())}
	args = serial.qemuArgs()
	if strings.Contains(strings.Join(args, " "), "vhost-vsock") || !strings.Contains(strings.Join(args, " "), wirePortName) {
		t.Fatalf("serial: %q", args)
	}
	if files, err := serial.qemuFiles(); files != nil || err != nil {
		t.Fatalf("serial qemuFiles = %v, %v", files, err)
	}
	if w := guestWire(0); w.Port != wirePortName || w.VsockPort != 0 {
		t.Fatalf("serial guest wire: %+v", w)
	}
	for _, port := range []uint32{0, LinkVsockPortMin, LinkVsockPort} {
		c := vmguest.Config{Hostname: "h", Root: "/srv/r", AwaitIdentity: true, AdmissionFile: "/run/a",
			Receiver: []string{"/usr/bin/r"}, Wire: guestWire(port)}
		if err := c.Validate(); err != nil {
			t.Fatalf("vsock port %d: the guest refuses its wire: %v", port, err)
		}
	}
}
