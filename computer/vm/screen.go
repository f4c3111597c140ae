package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/vm/guest"
	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/statedir"
	"github.com/tetherdev/tether/qmpinput/token"
	"github.com/tetherdev/tether/qmpinput/view"
)

// A VM computer with a screen has a display device, a USB tablet (and
// the PC's PS/2 keyboard), and QEMU serves the display as VNC on a unix
// socket in DIR/qemu; a second QMP socket there is the live view's
// alone (QEMU's QMP socket serves one client at a time, and the view
// holds its connection for its whole life). The live view
// (qmpinput/view) runs in the provisioner's process on loopback and
// reaches both sockets only through qmpinput's pins (socket, directory
// and peer all QEMU's uid). Its state, tokens and the hash-chained
// audit log, is DIR/screen; KeepRecords moves it to the records.
//
// Pause: the VM's owner is the service. The view's own pause and resume
// are refused (view.Config.PauseOwner), and Freeze and Thaw go through
// the view (view.Server.Pause, Resume), so a suspended computer shows
// as paused on every page, its person's input is held back, and the
// audit log records the suspend and the resume.

// Screen facts.
const (
	// ScreenWidth and ScreenHeight are the display's size in pixels.
	ScreenWidth  = 1280
	ScreenHeight = 800
	// screenDevice is the display's QOM id, pinned by the view.
	screenDevice = "video0"
	// ScreenPauser names the service in the view's audit log and pages
	// when it suspends or resumes the computer.
	ScreenPauser = "tether-computer (suspend)"
	// screenListen is where the view listens: loopback, a fresh port.
	screenListen = "127.0.0.1:0"
)

// ErrNoScreen: the machine was made without a screen, or its view has
// stopped.
var ErrNoScreen = errors.New("vm: no screen")

// screenModules are the guest modules a screen needs: the display's
// framebuffer driver (fbcon then draws tty1 on it) and the USB tablet.
var screenModules = append([]string{"bochs"}, guest.ModulesUSBTablet...)

// PrepareScreen implements api.ScreenProvisioner: Prepare for a machine
// with a screen and a live view. A screen machine always boots cold
// (its devices differ from the saved state's).
func (p *Provisioner) PrepareScreen(ctx context.Context, dir string, limits api.Limits) (api.Machine, error) {
	return p.prepare(ctx, dir, limits, true)
}

// screenArgs are QEMU's arguments for the screen; none without one.
func (m *Machine) screenArgs() []string {
	if !m.screen {
		return nil
	}
	return append([]string{
		"-device", fmt.Sprintf("VGA,id=%s,xres=%d,yres=%d", screenDevice, ScreenWidth, ScreenHeight),
		"-device", "qemu-xhci", "-device", "usb-tablet",
	}, append(guest.QMPSocket(m.paths.viewQMP), guest.VNCSocket(m.paths.vnc)...)...)
}

// screenAppend are the kernel's extra words for a screen: the console
// never blanks.
func (m *Machine) screenAppend() []string {
	if !m.screen {
		return nil
	}
	return []string{"consoleblank=0"}
}

// screen is a machine's live view; stop ends it.
type screen struct {
	dir     *statedir.Dir
	adapter *qmpinput.Adapter
	srv     *view.Server
	tokens  *token.Store
	log     *auditlog.Log
	origin  string
	cancel  context.CancelFunc
	done    chan struct{}

	mu      sync.Mutex
	stopped bool
	once    sync.Once
}

// startScreen serves the machine's live view on loopback until stop.
func (m *Machine) startScreen(ctx context.Context) error {
	dir, err := statedir.Open(m.paths.screen)
	if err != nil {
		return err
	}
	s := &screen{dir: dir, tokens: token.Open(dir, nil), log: auditlog.New(dir, nil), done: make(chan struct{})}
	if err := m.openScreen(ctx, s); err != nil {
		s.close()
		return err
	}
	m.mu.Lock()
	m.scr = s
	m.mu.Unlock()
	return nil
}

// openScreen opens the adapter, the listener and the view, and serves.
func (m *Machine) openScreen(ctx context.Context, s *screen) error {
	aud := view.NewAuditor(s.log)
	owner := m.qemuUID
	octx, cancel := context.WithTimeout(ctx, qmpTimeout)
	a, err := qmpinput.Open(octx, qmpinput.Config{Socket: m.paths.viewQMP, Owner: &owner,
		Display: qmpinput.Display{Device: screenDevice}, CaptureParent: m.paths.dir, Audit: aud.Record})
	cancel()
	if err != nil {
		return fmt.Errorf("screen: open QMP: %w", err)
	}
	s.adapter = a
	l, origin, err := view.Listen(screenListen, nil)
	if err != nil {
		return fmt.Errorf("screen: %w", err)
	}
	s.origin = origin
	s.srv, err = view.New(view.Config{Adapter: a, VNC: m.paths.vnc, VNCOwner: &owner, Tokens: s.tokens, Auditor: aud,
		Origins: []string{origin}, Name: "tether " + m.alloc.Tuple.Sandbox, PauseOwner: "tether-computer",
		Logf: func(f string, args ...any) { m.p.logf("vm screen: "+f, args...) }})
	if err != nil {
		l.Close()
		return fmt.Errorf("screen: %w", err)
	}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = stop
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(sctx, l); err != nil {
			m.p.logf("vm screen: %v", err)
		}
	}()
	return nil
}

// close stops the view (every viewer closed, any hold ended and
// recorded) and closes its adapter and state directory. Safe twice.
func (s *screen) close() {
	s.once.Do(func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		if s.cancel != nil {
			s.cancel()
			<-s.done
		}
		if s.adapter != nil {
			s.adapter.Close()
		}
		s.dir.Close()
	})
}

// liveScreen returns the machine's view while it serves, else nil.
func (m *Machine) liveScreen() *screen {
	m.mu.Lock()
	s := m.scr
	m.mu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	return s
}

// stopScreen ends the view, if there is one.
func (m *Machine) stopScreen() {
	m.mu.Lock()
	s := m.scr
	m.mu.Unlock()
	if s != nil {
		s.close()
	}
}

// MintLink implements api.Screen: a one-time link of role, live for
// ttl, whose label (who it is for; cut to token.MaxLabel bytes) shows
// on the page and in the audit log, with the mint itself recorded there.
func (m *Machine) MintLink(_ context.Context, role string, ttl time.Duration, label string) (api.Link, error) {
	s := m.liveScreen()
	if s == nil {
		return api.Link{}, ErrNoScreen
	}
	tok, secret, err := s.tokens.Mint(token.Role(role), ttl, clipLabel(label))
	if err != nil {
		return api.Link{}, fmt.Errorf("mint a %s link: %w", role, err)
	}
	if _, err := s.log.Append(auditlog.Record{Kind: auditlog.KindTokenMint, Actor: "tether-computer",
		Role: string(tok.Role), Token: tok.ID, Scope: tok.Actor(), TTLMillis: ttl.Milliseconds()}); err != nil {
		if _, rerr := s.tokens.Revoke(tok.ID); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return api.Link{}, fmt.Errorf("record the mint of a %s link: %w", role, err)
	}
	return api.Link{Link: s.origin + "/#t=" + string(secret), Role: string(tok.Role), ExpiresAt: tok.Expires}, nil
}

// AttendedAt implements api.Attended: when a person last held the
// view's input (view.Server.AttendedAt); the zero time for a machine
// without a screen, and once its view has stopped (nobody can hold its
// input any more).
func (m *Machine) AttendedAt() time.Time {
	s := m.liveScreen()
	if s == nil {
		return time.Time{}
	}
	return s.srv.AttendedAt()
}

// pauseScreen and resumeScreen stop and restart the guest through the
// view when it serves (handled reports whether it did).
// The machine counts as frozen exactly when the view's adapter says
// the VM is paused (a pause whose audit record failed still stopped the
// VM).
func (m *Machine) pauseScreen(ctx context.Context) (handled bool, err error) {
	s := m.liveScreen()
	if s == nil {
		return false, nil
	}
	err = s.srv.Pause(ctx, ScreenPauser)
	_, _, paused := s.adapter.Paused()
	m.setFrozen(paused)
	return true, err
}

func (m *Machine) resumeScreen(ctx context.Context) (handled bool, err error) {
	s := m.liveScreen()
	if s == nil {
		return false, nil
	}
	err = s.srv.Resume(ctx, ScreenPauser)
	_, _, paused := s.adapter.Paused()
	m.setFrozen(paused)
	return true, err
}

// keepScreenRecords stops the view and moves its state (the audit log,
// and the tokens, every one now useless) to dst/screen.
func (m *Machine) keepScreenRecords(dst string) error {
	if !m.screen {
		return nil
	}
	m.stopScreen()
	if err := os.Rename(m.paths.screen, filepath.Join(dst, "screen")); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("keep the screen's records: %w", err)
	}
	return nil
}

// clipLabel cuts label to at most token.MaxLabel bytes, at a rune's
// start, and drops what is not printable, so any caller's name mints.
func clipLabel(label string) string {
	label = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, label)
	for len(label) > token.MaxLabel {
		_, n := utf8.DecodeLastRuneInString(label)
		label = label[:len(label)-n]
	}
	return label
}
