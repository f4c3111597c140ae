package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/vm/guest"
)

// Provisioner makes VM computers (api.Provisioner). It keeps the kernel
// and the accelerator it chose; everything of one machine is in its
// directory and its cgroups.
type Provisioner struct {
	cfg Config

	mu     sync.Mutex
	k      *guest.Kernel
	accel  *guest.Accel
	logged bool
	img    imageOnce

	// stateMu serialises making saved states; fresh holds the slots
	// found current since this Provisioner began.
	stateMu sync.Mutex
	fresh   map[string]bool

	// tr is the link's transport (vsock.go), chosen at NewProvisioner;
	// trErr refuses every Prepare when the choice failed. links serves
	// the vsock links, made by the first computer that needs it.
	tr      TransportChoice
	trErr   error
	linksMu sync.Mutex
	links   *vsockLinks
}

var (
	_ api.Provisioner       = (*Provisioner)(nil)
	_ api.ScreenProvisioner = (*Provisioner)(nil)
)

// NewProvisioner returns a Provisioner making VM computers as cfg says.
// The link's transport is chosen here (ChooseTransport); Transport says
// which, or why none.
func NewProvisioner(cfg Config) *Provisioner {
	p := &Provisioner{cfg: cfg}
	p.tr, p.trErr = ChooseTransport(cfg.Transport, cfg.StateDir)
	return p
}

// Transport is the link's transport every computer of p uses, and why;
// the error is ChooseTransport's (ErrVsock), and Prepare then fails
// with it.
func (p *Provisioner) Transport() (TransportChoice, error) { return p.tr, p.trErr }

// vsockLinks returns the listener of the guests' vsock links, listening
// on the first call.
func (p *Provisioner) vsockLinks() (*vsockLinks, error) {
	p.linksMu.Lock()
	defer p.linksMu.Unlock()
	if p.links != nil {
		return p.links, nil
	}
	ln, port, err := listenLinks()
	if err != nil {
		return nil, err
	}
	p.links = newVsockLinks(ln, port, p.cfg.Log)
	p.logf("vm: vsock links on host port %d", port)
	return p.links, nil
}

// Close stops listening for vsock links (computers already linked keep
// their connection); safe to call twice.
func (p *Provisioner) Close() error {
	p.linksMu.Lock()
	defer p.linksMu.Unlock()
	if p.links == nil {
		return nil
	}
	return p.links.Close()
}

// useVsock says whether this Provisioner's computers link over vsock.
func (p *Provisioner) useVsock() bool { return p.trErr == nil && p.tr.Name == TransportVsock }

// Prepare implements api.Provisioner: it boots a guest whose receiver
// serves a snapshot holding no grant. On failure everything made is
// removed and the error names the failed step.
func (p *Provisioner) Prepare(ctx context.Context, dir string, limits api.Limits) (api.Machine, error) {
	return p.prepare(ctx, dir, limits, false)
}

// prepare is Prepare, with a screen or without.
func (p *Provisioner) prepare(ctx context.Context, dir string, limits api.Limits, screen bool) (api.Machine, error) {
	d, err := provision.CheckDir(dir)
	if err != nil {
		return nil, err
	}
	m, err := p.prepareMachine(ctx, d, limits, screen, nil)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// prepareMachine runs Prepare's steps in the checked directory d; with
// disk set, the writable disk is read from that disk export (disk.go).
func (p *Provisioner) prepareMachine(ctx context.Context, d string, limits api.Limits, screen bool, disk io.Reader) (*Machine, error) {
	m := &Machine{p: p, paths: layout(d), limits: limits, screen: screen, importFrom: disk}
	if err := m.prepare(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// Adopt implements api.Provisioner: a VM computer's QEMU dies with the
// service that made it, so there is never one to adopt (ErrNotAdoptable);
// the service then calls Destroy.
func (p *Provisioner) Adopt(_ context.Context, dir string) (api.Machine, error) {
	return nil, fmt.Errorf("%w: %s", ErrNotAdoptable, dir)
}

// Destroy implements api.Provisioner: it kills whatever runs in the
// cgroups DIR/vm.json names, removes them and the directory, and proves
// nothing is left. A directory that does not exist is destroyed.
func (p *Provisioner) Destroy(ctx context.Context, dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	s, err := readState(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	cg := cgroups{root: p.cgroupRoot(), name: s.Cgroup}
	var errs []error
	if s.Cgroup != "" {
		errs = append(errs, cg.remove(ctx))
	}
	errs = append(errs, os.RemoveAll(dir), nothingLeft(dir, cg, s.QEMUPID))
	return errors.Join(errs...)
}

func (p *Provisioner) cgroupRoot() string {
	if p.cfg.CgroupRoot != "" {
		return p.cfg.CgroupRoot
	}
	return "/sys/fs/cgroup"
}

// kernel finds the guest kernel once.
func (p *Provisioner) kernel() (guest.Kernel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.k != nil {
		return *p.k, nil
	}
	dir := p.cfg.KernelDir
	if dir == "" {
		dir = guest.KernelDir(guest.KernelVMSuite)
	}
	k, err := guest.KernelAt(dir)
	if err != nil {
		return guest.Kernel{}, fmt.Errorf("%w (ci/vmkernel unpacks it)", err)
	}
	p.k = &k
	return k, nil
}

// chooseAccel resolves Config.Accel once: AccelAuto boots a probe guest
// under KVM and falls back to TCG; the choice and the transport are
// logged once.
func (p *Provisioner) chooseAccel(ctx context.Context, k guest.Kernel) (guest.Accel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.accel != nil {
		return *p.accel, nil
	}
	mode := p.cfg.Accel
	if mode == "" {
		mode = AccelAuto
	}
	work := ""
	if mode != AccelTCG {
		d, err := os.MkdirTemp("", "tether-kvm-probe-")
		if err != nil {
			return guest.Accel{}, err
		}
		defer os.RemoveAll(d)
		work = d
	}
	a, err := guest.ChooseAccel(ctx, mode, k, p.cfg.QEMU, work)
	if err != nil {
		return guest.Accel{}, err
	}
	p.accel = &a
	p.logf("vm: accelerator %s (%s); transport %s", a.Name, a.Reason, p.transport())
	return a, nil
}

// transport names the host-guest channel and why it was chosen.
func (p *Provisioner) transport() string {
	if p.trErr != nil {
		return "none (" + p.trErr.Error() + ")"
	}
	return p.tr.String()
}

func (p *Provisioner) logf(format string, args ...any) {
	if p.cfg.Log != nil {
		p.cfg.Log(format, args...)
	}
}

// consoleWriter passes console lines to Config.Log.
func (p *Provisioner) consoleWriter() io.Writer {
	if p.cfg.Log == nil {
		return nil
	}
	return logWriter{p.cfg.Log}
}

type logWriter struct{ f func(string, ...any) }

func (w logWriter) Write(b []byte) (int, error) {
	w.f("guest: %s", string(b))
	return len(b), nil
}
