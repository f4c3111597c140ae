package custodian

import (
	"sync"
	"time"

	"github.com/tetherdev/tether/custodian/binding"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// session is the custodian's side of a bound session: the binding
// package's row (state, lease, fencing token, refusals), the connection
// it is bound on, the receiver it runs on, its terminals and its audit
// folds. It is the row's Local.
type session struct {
	*binding.Session
	Receiver *Receiver
	conn     *Conn

	mu        sync.Mutex
	terminals map[string]*terminal
	released  []string              // ids of released terminals still in terminals, oldest first
	folds     map[string]*auditFold // by method, each made at its first record (auditfold.go)
}

// sessionOf returns the custodian's side of row s.
func sessionOf(s *binding.Session) *session { return s.Local.(*session) }

// maxReleasedKept bounds the released terminals a binding remembers so that
// a repeated terminal/release or terminal/kill is answered without error;
// an older one is forgotten (not_found, nothing forwarded).
const maxReleasedKept = 1024

// terminal is a child started through this binding.
type terminal struct {
	createKey string            // store key of the terminal/create receipt (opstore.Key)
	expect    map[string]string // relative path -> expected SHA-256
	// deadline is its terminal/create's deadline: the receiver kills the
	// command at it at the latest.
	deadline time.Time

	// mu orders the recording of the exec's exit: whichever of
	// wait_for_exit, output or release observes it first records it.
	mu       sync.Mutex
	exit     *wire.ExitStatus // the exit the custodian observed; nil until then
	recorded bool             // the create receipt holds its final outcome
	// final is the command's final output once an answer carried it
	// (exec_wait, or exec_output showing the exit): terminal/output is
	// then answered from it. goneRemote: the receiver forgot the terminal
	// with its final wait (TerminalArgs.Release), so kill and release
	// send nothing.
	final      *wire.ExecOutputResult
	goneRemote bool
	// replayOf is the receipt a replay handle answers from (replay.go);
	// nil for a terminal this custodian started.
	replayOf *opstore.Receipt

	// rel orders this session's releases of the terminal: one is sent at a
	// time, a repeated one after a success sends nothing (relDone,
	// released).
	rel relState

	// waits counts the releasing exec_waits in flight (under mu); waitIdle
	// is closed when the count falls to 0, after the answer's final output
	// is kept, so a kill or release the receiver answered not_found
	// because such a wait had just made it forget the terminal can tell.
	waits    int
	waitIdle chan struct{}
}

// beginReleasingWait counts a releasing exec_wait in flight; its caller
// calls endReleasingWait once the answer is kept (or lost).
func (t *terminal) beginReleasingWait() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waits == 0 {
		t.waitIdle = make(chan struct{})
	}
	t.waits++
}

func (t *terminal) endReleasingWait() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waits--; t.waits == 0 {
		close(t.waitIdle)
	}
}

// releasingWaitIdle returns a channel closed when no releasing wait is in
// flight any more, and whether one is in flight now.
func (t *terminal) releasingWaitIdle() (<-chan struct{}, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.waitIdle, t.waits > 0
}

// relState is where a terminal's release is: relDone is non-nil while one
// is in flight and closed when it has its answer; released is set once a
// release succeeded (the receiver has forgotten the terminal). order is
// held for reading by a kill while it is sent and for writing by a release
// while it is sent, so a kill never reaches the receiver after the release
// that made it forget the terminal.
type relState struct {
	mu       sync.Mutex
	relDone  chan struct{}
	released bool
	order    sync.RWMutex
}

// beginRelease claims the release of t for the caller (first) unless t is
// released already; otherwise it returns the channel of the release in
// flight, to wait on before asking again.
func (t *terminal) beginRelease() (first, released bool, inFlight <-chan struct{}) {
	t.rel.mu.Lock()
	defer t.rel.mu.Unlock()
	switch {
	case t.rel.released:
		return false, true, nil
	case t.rel.relDone != nil:
		return false, false, t.rel.relDone
	}
	t.rel.relDone = make(chan struct{})
	return true, false, nil
}

// endRelease settles the release the caller claimed; after a failure the
// next release is sent again.
func (t *terminal) endRelease(ok bool) {
	t.rel.mu.Lock()
	defer t.rel.mu.Unlock()
	t.rel.released = ok
	close(t.rel.relDone)
	t.rel.relDone = nil
}

// releaseState reports whether t is released or a release is in flight.
func (t *terminal) releaseState() (released, inFlight bool) {
	t.rel.mu.Lock()
	defer t.rel.mu.Unlock()
	return t.rel.released, t.rel.relDone != nil
}

func (b *session) addTerminalIfAbsent(id string, t *terminal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.terminals[id]; !ok {
		b.terminals[id] = t
	}
}

func (b *session) terminal(id string) (*terminal, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.terminals[id]
	return t, ok
}

// markReleased keeps a released terminal known, so a repeated release or
// kill is answered without error, forgetting the oldest beyond
// maxReleasedKept.
func (b *session) markReleased(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.released = append(b.released, id)
	if len(b.released) > maxReleasedKept {
		delete(b.terminals, b.released[0])
		b.released = b.released[1:]
	}
}
