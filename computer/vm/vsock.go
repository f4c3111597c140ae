package vm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"
)

// The link's transport (Config.Transport): the muxlink over one
// virtio-serial port (QEMU's unix-socket chardev), or over one vsock
// connection the guest's PID 1 dials to the daemon (docs/decisions.md
// "VM link over vsock").
const (
	TransportModeSerial = "serial" // the default
	TransportModeVsock  = "vsock"  // fails where /dev/vhost-vsock does not open
	TransportModeAuto   = "auto"   // vsock where /dev/vhost-vsock opens, else serial
	TransportVsock      = "vsock"  // the transport's name in MachineInfo
)

// VhostVsockDevice is the host's vsock device; the daemon opens it and
// passes QEMU the descriptor, so QEMU's uid never needs the node.
const VhostVsockDevice = "/dev/vhost-vsock"

// LinkVsockPort is the first host vsock port a daemon tries for its
// guests' links, down to LinkVsockPortMin (a second daemon on the host
// takes the next free one); the port is in each guest's configuration.
// They are below 1024: only a process with CAP_NET_BIND_SERVICE (the
// root daemon) can bind them on the host.
const (
	LinkVsockPort    = 1021
	LinkVsockPortMin = 1000
)

// minGuestCID is the lowest context id a guest may have (0, 1 and 2 are
// the hypervisor, the local loopback and the host).
const minGuestCID = 3

// ErrVsock wraps every refusal of the vsock transport's configuration.
var ErrVsock = errors.New("vm: vsock transport")

// TransportChoice is the link's transport a Provisioner uses for every
// computer, and why.
type TransportChoice struct {
	Name   string // TransportVirtioSerial or TransportVsock
	Reason string
}

func (t TransportChoice) String() string { return t.Name + " (" + t.Reason + ")" }

// openVhostVsock opens the vsock device; a variable so tests can stand
// in for a host that has it.
var openVhostVsock = func() (*os.File, error) {
	return os.OpenFile(VhostVsockDevice, os.O_RDWR|unix.O_CLOEXEC, 0)
}

// ChooseTransport resolves Config.Transport ("" is serial). vsock where
// the device does not open fails, naming the device; so does vsock with
// saved states (a migrated vhost-vsock device is not built: auto then
// says serial, with that reason).
func ChooseTransport(mode, stateDir string) (TransportChoice, error) {
	serial := TransportChoice{Name: TransportVirtioSerial}
	switch mode {
	case "", TransportModeSerial:
		serial.Reason = "--vm-transport serial"
		return serial, nil
	case TransportModeVsock, TransportModeAuto:
	default:
		return TransportChoice{}, fmt.Errorf("%w: unknown transport %q (serial, vsock or auto)", ErrVsock, mode)
	}
	err := vhostUsable()
	if err == nil && stateDir != "" {
		err = errors.New("saved states (--vm-state) are made over virtio-serial; a vhost-vsock device is not migrated in this version")
	}
	switch {
	case err == nil:
		return TransportChoice{Name: TransportVsock, Reason: VhostVsockDevice + " opens, --vm-transport " + mode}, nil
	case mode == TransportModeAuto:
		serial.Reason = "--vm-transport auto: " + err.Error()
		return serial, nil
	default:
		return TransportChoice{}, fmt.Errorf("%w: %w", ErrVsock, err)
	}
}

// vhostUsable opens and closes the device once; the error (an
// *os.PathError) names it.
func vhostUsable() error {
	f, err := openVhostVsock()
	if err != nil {
		return err
	}
	return f.Close()
}

// linkListener is what vsockLinks needs of a listener: mdlayher/vsock's
// *Listener satisfies it; the tests' fake does too.
type linkListener interface {
	Accept() (net.Conn, error)
	Close() error
}

var _ linkListener = (*vsock.Listener)(nil)

// listenLinks binds the first free port from LinkVsockPort down to
// LinkVsockPortMin on every context id of the host.
func listenLinks() (linkListener, uint32, error) {
	var errs []error
	for port := uint32(LinkVsockPort); port >= LinkVsockPortMin; port-- {
		ln, err := vsock.ListenContextID(unix.VMADDR_CID_ANY, port, nil)
		if err == nil {
			return ln, port, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return nil, 0, fmt.Errorf("%w: listen on vsock port %d: %w", ErrVsock, port, err)
		}
		errs = append(errs, err)
	}
	return nil, 0, fmt.Errorf("%w: vsock ports %d..%d all taken: %w", ErrVsock, LinkVsockPortMin, LinkVsockPort, errors.Join(errs...))
}

// vsockLinks hands each computer the one link connection its guest
// dials: a connection is taken only from a context id a computer
// reserved (the hypervisor vouches for it: no host process can bind a
// guest's context id), once; any other, and a second from the same
// context id, is closed and logged. Close must be called.
type vsockLinks struct {
	ln   linkListener
	port uint32 // the port ln listens on, which the guests dial
	log  func(string, ...any)

	mu    sync.Mutex
	slots map[uint32]*linkSlot

	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// linkSlot is one reserved context id: conn receives its link once.
type linkSlot struct {
	conn  chan net.Conn // buffered 1
	taken bool
}

// newVsockLinks serves ln, listening on port, until Close.
func newVsockLinks(ln linkListener, port uint32, log func(string, ...any)) *vsockLinks {
	if log == nil {
		log = func(string, ...any) {}
	}
	l := &vsockLinks{ln: ln, port: port, log: log, slots: map[uint32]*linkSlot{}, done: make(chan struct{})}
	l.wg.Add(1)
	go l.serve()
	return l
}

func (l *vsockLinks) serve() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.log("vm: vsock link accept: %v", err)
			continue
		}
		if err := l.deliver(c); err != nil {
			l.log("vm: vsock link from %s refused: %v", c.RemoteAddr(), err)
			_ = c.Close()
		}
	}
}

// deliver gives c to the computer whose context id it comes from.
func (l *vsockLinks) deliver(c net.Conn) error {
	cid, err := peerCID(c.RemoteAddr())
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.slots[cid]
	switch {
	case !ok:
		return fmt.Errorf("context id %d is no computer's", cid)
	case s.taken:
		return fmt.Errorf("context id %d already has its link", cid)
	}
	s.taken = true
	s.conn <- c
	return nil
}

// peerCID is a vsock address's context id.
func peerCID(a net.Addr) (uint32, error) {
	va, ok := a.(*vsock.Addr)
	if !ok {
		return 0, fmt.Errorf("peer address %T is not a vsock address", a)
	}
	return va.ContextID, nil
}

// reserve picks a fresh random context id for a computer (at least 3,
// none this daemon holds) and waits for its link. Another daemon on the
// host may hold the same id: vhost then refuses it and QEMU fails to
// start (EADDRINUSE), failing the one Prepare; with 2^32 ids that is
// rare. release gives it back.
func (l *vsockLinks) reserve() (uint32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range 16 {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		cid := binary.BigEndian.Uint32(b[:])
		if cid < minGuestCID || cid >= unix.VMADDR_CID_ANY || l.slots[cid] != nil {
			continue
		}
		l.slots[cid] = &linkSlot{conn: make(chan net.Conn, 1)}
		return cid, nil
	}
	return 0, fmt.Errorf("%w: no free context id after 16 draws", ErrVsock)
}

// wait returns cid's link connection once its guest dialed; the caller
// closes it. gone ends the wait early (QEMU exited).
func (l *vsockLinks) wait(ctx context.Context, cid uint32, gone <-chan struct{}) (net.Conn, error) {
	l.mu.Lock()
	s := l.slots[cid]
	l.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("%w: context id %d is not reserved", ErrVsock, cid)
	}
	select {
	case c := <-s.conn:
		return c, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("the guest did not dial vsock port %d: %w", l.port, ctx.Err())
	case <-gone:
		return nil, fmt.Errorf("%w: QEMU exited before the guest dialed vsock port %d", ErrGuest, l.port)
	case <-l.done:
		return nil, fmt.Errorf("%w: the link listener closed", ErrVsock)
	}
}

// release forgets cid; a link delivered and never waited for is closed.
func (l *vsockLinks) release(cid uint32) {
	l.mu.Lock()
	s := l.slots[cid]
	delete(l.slots, cid)
	l.mu.Unlock()
	if s == nil {
		return
	}
	select {
	case c := <-s.conn:
		_ = c.Close()
	default:
	}
}

// Close stops accepting and joins the accept loop; safe to call twice.
func (l *vsockLinks) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
		l.wg.Wait()
	})
	return err
}

// vsockDeviceArgs is QEMU's vhost-vsock device for guest context id cid,
// on the vhost descriptor QEMU holds as fd (the daemon opened it).
func vsockDeviceArgs(cid uint32, fd int) []string {
	return []string{"-device", "vhost-vsock-pci,id=tether-vsock,guest-cid=" + strconv.FormatUint(uint64(cid), 10) +
		",vhostfd=" + strconv.Itoa(fd)}
}
