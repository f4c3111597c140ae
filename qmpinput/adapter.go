package qmpinput

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"golang.org/x/time/rate"
)

// Display pins the display whose screen is captured and whose console
// receives input: the QOM id of the display device (-device VGA,id=video0)
// and its head.
type Display struct {
	Device string
	Head   int
}

// Config configures an Adapter. Socket and Display.Device are required.
type Config struct {
	// Socket is the absolute path of QEMU's QMP unix socket
	// (-qmp unix:PATH,server=on,wait=off). Nothing else is accepted.
	Socket string
	// Owner is the uid that must own the socket, its directory (or root)
	// and the QEMU process; nil means the adapter's effective uid.
	Owner *uint32
	// Versions is the accepted QEMU range; zero means DefaultVersions.
	Versions VersionRange
	// Display is the pinned display device and head.
	Display Display
	// CaptureParent is where the private capture directory is created;
	// "" means os.TempDir().
	CaptureParent string
	// PoolBytes and PoolTTL bound retained captures (defaults 128 MiB, 10 min).
	PoolBytes int64
	PoolTTL   time.Duration
	// TypeRate is the typing rate limit in characters per second (default
	// 20); TypeBurst is how many characters may go at once (default 10).
	TypeRate  float64
	TypeBurst int
	// PressHold is the time between a button or key going down and up
	// (default 10 ms); DoubleClickGap the time between two clicks (60 ms).
	PressHold      time.Duration
	DoubleClickGap time.Duration
	// Audit receives handover begin and end records (actor, scope,
	// duration; never content). Handover.Begin is refused without it.
	Audit func(AuditEvent)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Adapter is the QmpInputAdapter: one pinned QMP connection, one pinned
// display, a private capture directory and a bounded capture pool. Its
// methods are safe for concurrent use; input operations run one at a time.
// Close must be called: it closes the QMP connection and deletes the
// capture directory.
type Adapter struct {
	cfg       Config
	owner     uint32
	conn      *conn
	dir       string
	pool      *pool
	seq       atomic.Uint64
	space     atomic.Pointer[pixelSpace]
	typeLimit *rate.Limiter
	opMu      sync.Mutex // one capture or input operation at a time
	handover  Handover
	pauseMu   sync.Mutex // one Pause or Resume at a time
	paused    atomic.Pointer[pauseState]
	closeOnce sync.Once
}

// Open connects to the pinned QMP socket, checks the QEMU version,
// negotiates capabilities and creates the private capture directory.
func Open(ctx context.Context, cfg Config) (*Adapter, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	owner := uint32(os.Geteuid())
	if cfg.Owner != nil {
		owner = *cfg.Owner
	}
	uc, err := dialPinned(ctx, cfg.Socket, owner)
	if err != nil {
		return nil, err
	}
	c, err := handshake(ctx, uc, cfg.Versions)
	if err != nil {
		return nil, err
	}
	dir, err := makeCaptureDir(cfg.CaptureParent, owner)
	if err != nil {
		c.shutdown()
		return nil, err
	}
	a := &Adapter{cfg: cfg, owner: owner, conn: c, dir: dir,
		pool:      newPool(cfg.PoolBytes, cfg.PoolTTL),
		typeLimit: rate.NewLimiter(rate.Limit(cfg.TypeRate), cfg.TypeBurst)}
	a.handover.a = a
	return a, nil
}

func (c *Config) defaults() error {
	if c.Display.Device == "" || strings.IndexFunc(c.Display.Device, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 || c.Display.Head < 0 {
		return fmt.Errorf("%w: a display device id (and head >= 0) must be pinned", ErrConfig)
	}
	if c.Versions == (VersionRange{}) {
		c.Versions = DefaultVersions
	}
	if c.CaptureParent == "" {
		c.CaptureParent = os.TempDir()
	}
	setDefault(&c.PoolBytes, DefaultPoolBytes)
	setDefault(&c.PoolTTL, DefaultPoolTTL)
	setDefault(&c.TypeRate, 20)
	setDefault(&c.TypeBurst, 10)
	setDefault(&c.PressHold, 10*time.Millisecond)
	setDefault(&c.DoubleClickGap, 60*time.Millisecond)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.PoolBytes < 0 || c.PoolTTL < 0 || c.TypeRate < 0 || c.TypeBurst < 1 {
		return fmt.Errorf("%w: negative limits", ErrConfig)
	}
	return nil
}

func setDefault[T int | int64 | float64 | time.Duration](v *T, d T) {
	if *v == 0 {
		*v = d
	}
}

// Greeting returns what QEMU announced when the adapter connected.
func (a *Adapter) Greeting() Greeting { return a.conn.greeting }

// CaptureDir returns the private directory captures are written to.
func (a *Adapter) CaptureDir() string { return a.dir }

// EventsDropped counts QMP events dropped because no one read them; events
// never delay command replies.
func (a *Adapter) EventsDropped() uint64 { return a.conn.dropped.Load() }

// Close ends any handover, closes the QMP connection and deletes the
// capture directory. It is safe to call more than once.
func (a *Adapter) Close() error {
	var err error
	a.closeOnce.Do(func() {
		a.handover.endCurrent(EndClosed)
		a.conn.shutdown()
		err = os.RemoveAll(a.dir)
	})
	return err
}

func (a *Adapter) now() time.Time { return a.cfg.Now() }

// input runs one agent input operation: refused while fenced, serialised
// with every other capture and input operation.
func (a *Adapter) input(ctx context.Context, fn func() error) error {
	if err := a.gate(); err != nil {
		return err
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if err := a.gate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn()
}

// gate refuses agent input while a handover holds input.
func (a *Adapter) gate() error { return a.agentGate(ErrFenced) }

func (a *Adapter) agentGate(sentinel error) error {
	if actor, ok := a.handover.active(); ok {
		return fmt.Errorf("%w (held by %s)", sentinel, actor)
	}
	if p := a.paused.Load(); p != nil && sentinel == ErrFenced {
		return fmt.Errorf("%w (VM paused by %s)", sentinel, p.actor)
	}
	if a.conn.fatal() != nil {
		return fmt.Errorf("%w: %w", ErrClosed, a.conn.fatal())
	}
	return nil
}

// UnsupportedError names the operation that does not exist here.
type UnsupportedError struct{ Op string }

func (e *UnsupportedError) Error() string { return fmt.Sprintf("%v: %s", ErrUnsupported, e.Op) }

func (e *UnsupportedError) Unwrap() error { return ErrUnsupported }

// Exec always fails with ErrUnsupported: the adapter cannot run commands.
func (a *Adapter) Exec(context.Context, []string) error { return &UnsupportedError{Op: "exec"} }

// ReadFile always fails with ErrUnsupported: the adapter has no files.
func (a *Adapter) ReadFile(context.Context, string) ([]byte, error) {
	return nil, &UnsupportedError{Op: "read_file"}
}

// WriteFile always fails with ErrUnsupported: the adapter has no files.
func (a *Adapter) WriteFile(context.Context, string, []byte) error {
	return &UnsupportedError{Op: "write_file"}
}

// Clipboard always fails with ErrUnsupported: no clipboard is shared.
func (a *Adapter) Clipboard(context.Context) (string, error) {
	return "", &UnsupportedError{Op: "clipboard"}
}

// SetClipboard always fails with ErrUnsupported: no clipboard is shared.
func (a *Adapter) SetClipboard(context.Context, string) error {
	return &UnsupportedError{Op: "clipboard"}
}

// OpenURL always fails with ErrUnsupported: there is no browser backend.
func (a *Adapter) OpenURL(context.Context, string) error { return &UnsupportedError{Op: "browser"} }
