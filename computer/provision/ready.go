package provision

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/errcode"
)

// readyBackstop is how long waitReadyWatched waits without an event
// before it asks the receiver again anyway. The receiver's last act of
// its start is to log that it serves, after every listener is up, so an
// event always follows readiness; the backstop only bounds the cost of a
// start that breaks that rule.
const readyBackstop = 250 * time.Millisecond

// readyWatch reports, through C, each time a starting receiver may have
// become ready: an entry appeared in its run directory (its socket, on
// bind) or its log was written (it logs "serving" once it listens, and
// the stage logs why it failed). Close stops it.
type readyWatch struct {
	C   chan struct{}
	wds []int32
}

// notifier is this process's one inotify descriptor, shared by every
// readyWatch and never closed: closing an inotify descriptor waits for
// an SRCU grace period of the kernel's fsnotify marks (about 15 ms on
// the build machine), which a wait with a descriptor of its own would add
// to every create. Removing a watch does not wait.
type notifier struct {
	once sync.Once
	err  error
	f    *os.File // non-blocking, in the runtime's poller

	mu   sync.Mutex
	subs map[int32]chan struct{}
}

var readyNotifier notifier

// start opens the descriptor and starts the goroutine that reads it
// for the life of the process; its error is kept for every later call.
func (n *notifier) start() error {
	n.once.Do(func() {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			n.err = fmt.Errorf("inotify: %w", err)
			return
		}
		n.f, n.subs = os.NewFile(uintptr(fd), "inotify"), map[int32]chan struct{}{}
		go n.loop()
	})
	return n.err
}

// loop wakes the watch of each event's descriptor (events of a watch
// already closed are dropped).
func (n *notifier) loop() {
	buf := make([]byte, 64<<10)
	for {
		k, err := n.f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			off += unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(buf[off+12:]))
			n.mu.Lock()
			ch := n.subs[wd]
			n.mu.Unlock()
			if ch != nil {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}
}

// watchReady starts watching the run directory and the receiver log of
// the computer at p; both must exist. The caller closes the watch.
func watchReady(p paths) (*readyWatch, error) {
	n := &readyNotifier
	if err := n.start(); err != nil {
		return nil, err
	}
	w := &readyWatch{C: make(chan struct{}, 1)}
	for _, x := range []struct {
		path string
		mask uint32
	}{{p.run, unix.IN_CREATE | unix.IN_MOVED_TO}, {p.receiverLog, unix.IN_MODIFY}} {
		wd, err := unix.InotifyAddWatch(int(n.f.Fd()), x.path, x.mask|unix.IN_DONT_FOLLOW)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("inotify watch %s: %w", x.path, err)
		}
		w.wds = append(w.wds, int32(wd))
		n.mu.Lock()
		n.subs[int32(wd)] = w.C
		n.mu.Unlock()
	}
	return w, nil
}

// Close removes the watch's inotify watches.
func (w *readyWatch) Close() {
	n := &readyNotifier
	for _, wd := range w.wds {
		n.mu.Lock()
		delete(n.subs, wd)
		n.mu.Unlock()
		_, _ = unix.InotifyRmWatch(int(n.f.Fd()), uint32(wd)) // gone with its directory: nothing to remove
	}
	w.wds = nil
}

// waitReadyWatched is waitReady driven by w's events instead of a fixed
// poll: it asks the receiver (attach for the tuple, as waitReady) once
// its socket exists and again after each event, until it answers, exits
// (an *ExitError with its log) or ReadyTimeout passes.
func (c *Local) waitReadyWatched(ctx context.Context, r *receiverProc, w *readyWatch) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	backstop := time.NewTimer(readyBackstop)
	defer backstop.Stop()
	var last error
	for {
		select {
		case <-r.done:
			return &ExitError{Status: exitStatus(r.err), Log: tail(c.paths.receiverLog, 4096)}
		default:
		}
		if _, err := os.Lstat(c.paths.socket); err == nil {
			if last = c.answers(ctx); last == nil {
				return nil
			}
		} else {
			last = err
		}
		backstop.Reset(readyBackstop)
		select {
		case <-ctx.Done():
			return fmt.Errorf("receiver did not answer within %s: %w (last: %v)", ReadyTimeout, ctx.Err(), last)
		case <-r.done:
		case <-w.C:
		case <-backstop.C:
		}
	}
}

// answers asks the receiver for the tuple as waitReady does: nil when it
// answered (admitted, or refused as fenced, or with Options.NoGrant as
// not admitted), else why not.
func (c *Local) answers(ctx context.Context) error {
	_, err := c.Attach(ctx)
	switch {
	case err == nil, errors.Is(err, &errcode.Error{Code: errcode.CodeFenced}):
		return nil
	case c.opts.NoGrant && errors.Is(err, &errcode.Error{Code: errcode.CodeNotAdmitted}):
		return nil
	}
	return err
}
