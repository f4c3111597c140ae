package signedfile

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/tetherdev/tether/admission"
)

// DefaultErrorRetry is how long a Refresher reuses a failed load while the
// file looks unchanged, so a broken file costs a stat per request, not a
// signature check.
const DefaultErrorRetry = time.Second

// RefresherOptions tune a Refresher; the zero value is the production
// setting.
type RefresherOptions struct {
	// NoWatch disables the fsnotify hint. Correctness never depends on it
	// (on 9p and virtiofs shares inotify is silent); tests use it to prove
	// that.
	NoWatch bool
	// ErrorRetry overrides DefaultErrorRetry.
	ErrorRetry time.Duration
}

// Refresher answers GrantSource lookups from the admission file as it is at
// request time. Every Lookup stats the file and its directory; when either
// changed (a rename, a write, a chmod or chown) or fsnotify hinted at a
// change, the file is loaded again through every check of the Loader
// before the request is answered. A snapshot is swapped in whole, so a
// request never sees a torn one, and a failed load replaces the snapshot
// with the failure: there is no fallback to an older file.
//
// The caller must call Close, which stops the fsnotify goroutine. A
// Refresher is safe for concurrent use.
type Refresher struct {
	l          *Loader
	now        func() time.Time
	errorRetry time.Duration

	state atomic.Pointer[refreshState]
	dirty atomic.Bool // set by the fsnotify hint
	mu    sync.Mutex  // serialises reloads

	watcher   *fsnotify.Watcher
	ctx       context.Context // ends the watcher's reloads on Close
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

var _ admission.GrantSource = (*Refresher)(nil)

// refreshState is one immutable outcome of a load.
type refreshState struct {
	dir, file stamp
	loaded    *Loaded        // nil when err is set
	index     map[string]int // tuple_sha256 -> index in loaded.Snapshot.Grants
	err       error
	at        time.Time // when err was recorded (monotonic clock)
}

// NewRefresher returns a Refresher over l and tries a first load; a failed
// first load is not an error here (the file may be published later), it is
// what every Lookup returns until the file is good. The watcher goroutine
// it starts ends with Close.
func NewRefresher(ctx context.Context, l *Loader, opts RefresherOptions) (*Refresher, error) {
	if l == nil {
		return nil, errors.New("admission refresher: nil loader")
	}
	r := &Refresher{l: l, now: l.cfg.Now, errorRetry: opts.ErrorRetry, done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if r.errorRetry <= 0 {
		r.errorRetry = DefaultErrorRetry
	}
	if !opts.NoWatch {
		r.watch()
	}
	if r.watcher == nil {
		close(r.done)
	}
	r.current(ctx) // warm the state; errors are returned by Lookup
	return r, nil
}

// Lookup returns the grant of the current snapshot for the tuple with
// digest tupleSHA256, if it allows op, and the snapshot generation. Errors
// wrap ErrNoGrant, ErrGrantExpired or ErrOpNotAllowed, or are a
// *TrustError (wrapping ErrUntrusted) when the file itself is refused. The
// grant returned is the caller's own copy.
func (r *Refresher) Lookup(ctx context.Context, tupleSHA256 string, op admission.Op) (admission.Grant, uint64, error) {
	s, err := r.current(ctx)
	if err != nil {
		return admission.Grant{}, 0, err
	}
	snap := &s.loaded.Snapshot
	now := r.now()
	if err := r.checkFresh(snap, now); err != nil {
		return admission.Grant{}, 0, err
	}
	i, ok := s.index[tupleSHA256]
	if !ok {
		return admission.Grant{}, 0, fmt.Errorf("admission generation %d: %w: tuple_sha256 %q", snap.Generation, admission.ErrNoGrant, tupleSHA256)
	}
	g := snap.Grants[i]
	if now.After(g.NotAfter) {
		return admission.Grant{}, 0, fmt.Errorf("admission generation %d: %w: grant for %s ended at %s",
			snap.Generation, admission.ErrGrantExpired, tupleSHA256, rfc3339(g.NotAfter))
	}
	if !op.Valid() || !g.Allows(op) {
		return admission.Grant{}, 0, fmt.Errorf("admission generation %d: %w: %q is not in %v", snap.Generation, admission.ErrOpNotAllowed, op, g.Ops)
	}
	return cloneGrant(g), snap.Generation, nil
}

// Current returns a copy of the current snapshot after the same request-time
// checks as Lookup (the file as it is now, and not expired).
func (r *Refresher) Current(ctx context.Context) (admission.Snapshot, error) {
	s, err := r.current(ctx)
	if err != nil {
		return admission.Snapshot{}, err
	}
	snap := s.loaded.Snapshot
	if err := r.checkFresh(&snap, r.now()); err != nil {
		return admission.Snapshot{}, err
	}
	snap.Grants = make([]admission.Grant, len(s.loaded.Snapshot.Grants))
	for i, g := range s.loaded.Snapshot.Grants {
		snap.Grants[i] = cloneGrant(g)
	}
	return snap, nil
}

// checkFresh refuses a snapshot that expired since it was loaded.
func (r *Refresher) checkFresh(snap *admission.Snapshot, now time.Time) error {
	if now.After(snap.NotAfter) {
		return r.l.fail(CheckExpiry, nil, "snapshot generation %d expired at %s (now %s)",
			snap.Generation, rfc3339(snap.NotAfter), rfc3339(now))
	}
	return nil
}

func cloneGrant(g admission.Grant) admission.Grant {
	g.Groups = slices.Clone(g.Groups)
	g.Ops = slices.Clone(g.Ops)
	g.Env = slices.Clone(g.Env)
	return g
}

// current returns the state for the file as it is now: the cached one when
// the directory and the file stat the same as when it was loaded and no
// hint arrived, otherwise a fresh load.
func (r *Refresher) current(ctx context.Context) (*refreshState, error) {
	dir, file, err := r.stat()
	if err == nil {
		if s := r.state.Load(); r.fresh(s, dir, file) {
			return s, s.err
		}
	}
	return r.reload(ctx)
}

// stat returns the stamps of the directory and of the file (not following
// a final symlink).
func (r *Refresher) stat() (dir, file stamp, err error) {
	di, err := statPath(r.l.dir)
	if err != nil {
		return stamp{}, stamp{}, err
	}
	fi, err := statPath(r.l.cfg.Path)
	if err != nil {
		return stamp{}, stamp{}, err
	}
	// Only what the directory checks read: a new file in it changes its
	// times but not its trust.
	return stamp{dev: di.stamp.dev, ino: di.stamp.ino, mode: di.stamp.mode, uid: di.stamp.uid}, fi.stamp, nil
}

// fresh reports whether s still describes the file.
func (r *Refresher) fresh(s *refreshState, dir, file stamp) bool {
	if s == nil || r.dirty.Load() || s.dir != dir || s.file != file {
		return false
	}
	return s.err == nil || time.Since(s.at) < r.errorRetry
}

// reload loads the file again unless another request already did so for
// the file as it is now.
func (r *Refresher) reload(ctx context.Context) (*refreshState, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	dir, file, statErr := r.stat()
	if statErr == nil {
		if s := r.state.Load(); r.fresh(s, dir, file) {
			return s, s.err
		}
	}
	r.dirty.Store(false) // a hint arriving from now on forces another load
	ld, err := r.l.Load(ctx)
	if err != nil && ctx.Err() != nil {
		return nil, err // the caller gave up; the file's state is unknown
	}
	s := &refreshState{dir: dir, file: file, err: err, at: time.Now()}
	if err == nil {
		s.file, s.loaded, s.index = ld.stamp, ld, indexGrants(ld.Snapshot.Grants)
	}
	r.state.Store(s)
	return s, err
}

func indexGrants(gs []admission.Grant) map[string]int {
	idx := make(map[string]int, len(gs))
	for i, g := range gs {
		idx[g.Tuple.SHA256()] = i
	}
	return idx
}

// watch starts the fsnotify hint on the directory. Failure to watch is not
// an error: the stat on every request is what keeps Lookup correct.
func (r *Refresher) watch() {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return
	}
	if err := w.Add(r.l.dir); err != nil {
		w.Close()
		return
	}
	r.watcher = w
	go r.watchLoop()
}

// watchLoop marks the state dirty on any event for the file (or a lost
// event) and reloads off the request path.
func (r *Refresher) watchLoop() {
	defer close(r.done)
	for {
		select {
		case <-r.ctx.Done():
			return
		case ev, ok := <-r.watcher.Events:
			if !ok {
				return
			}
			if filepath.Base(ev.Name) == r.l.name {
				r.dirty.Store(true)
				r.reload(r.ctx)
			}
		case _, ok := <-r.watcher.Errors:
			if !ok {
				return
			}
			r.dirty.Store(true) // an event may have been lost
		}
	}
}

// Close stops the fsnotify goroutine and waits for it. It is safe to call
// more than once; Lookup keeps working (without the hint) after Close.
func (r *Refresher) Close() error {
	var err error
	r.closeOnce.Do(func() {
		r.cancel()
		if r.watcher != nil {
			err = r.watcher.Close()
		}
		<-r.done
	})
	return err
}
