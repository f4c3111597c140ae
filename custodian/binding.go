package custodian

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// bindState is where a binding is in its life.
type bindState int

const (
	// stateAwaitAttach: the bind was sent; nothing is dispatched until the
	// agent's `_tether/attach` is confirmed by the receiver.
	stateAwaitAttach bindState = iota
	// stateActive: callbacks are dispatched on the attach's epoch.
	stateActive
	// stateFenced: transport loss, a tuple mismatch or lease expiry;
	// nothing is dispatched until `_tether/attach` succeeds again.
	stateFenced
)

func (s bindState) String() string {
	return [...]string{"awaiting attach", "active", "fenced"}[s]
}

// Binding is what a session is bound to: the immutable tuple, the lease,
// the receiver it runs on and the principal it acts for.
type Binding struct {
	Tuple         admission.Tuple
	LeaseNotAfter time.Time
	Principal     string
	Receiver      *Receiver
	// Plain says the agent knows nothing of tether (docs/custodian.md
	// "Plain agents"): the custodian attaches the session itself once the
	// agent answered session/new or session/load, and again after a
	// transport loss; it tags a callback that carries no
	// `_meta["tether/op"]` itself (the binding's digest, a fresh op key,
	// min(command budget, lease) as the deadline), recording
	// tagged_by "custodian". A present but wrong tag still fences, and a
	// callback naming another session is still refused.
	Plain bool
}

// validate refuses a binding the custodian could not enforce.
func (b Binding) validate() error {
	switch {
	case b.Receiver == nil:
		return fmt.Errorf("%w: binding has no receiver", ErrConfig)
	case b.Principal == "":
		return fmt.Errorf("%w: binding has no principal", ErrConfig)
	case b.Principal != b.Tuple.Owner:
		return fmt.Errorf("%w: principal %q is not the tuple's owner %q", ErrConfig, b.Principal, b.Tuple.Owner)
	case b.LeaseNotAfter.IsZero():
		return fmt.Errorf("%w: binding has no lease_not_after", ErrConfig)
	}
	return b.Tuple.Validate()
}

// binding is one row of a connection's binding table.
type binding struct {
	sessionID string
	Binding
	digest string

	mu        sync.Mutex
	state     bindState
	fenceCode errcode.Code
	fenceWhy  string
	epoch     uint64
	grantGen  uint64
	terminals map[string]*terminal
	released  []string              // ids of released terminals still in terminals, oldest first
	refusals  *refusalTally         // made at the first refusal (refusals.go)
	folds     map[string]*auditFold // by method, each made at its first record (auditfold.go)

	// token is the fencing token this custodian holds for the session in
	// the fleet's op store (0: none, the single-machine store, or not
	// claimed yet); every receiver request carries it. claimMu makes
	// one claim at a time (fleet.go).
	token   atomic.Uint64
	claimMu sync.Mutex
}

// fenceToken returns the fencing token the session's requests carry.
func (b *binding) fenceToken() uint64 { return b.token.Load() }

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

func newBinding(sessionID string, b Binding) *binding {
	return &binding{sessionID: sessionID, Binding: b, digest: b.Tuple.SHA256(),
		state: stateAwaitAttach, terminals: map[string]*terminal{}}
}

// usable returns the epoch to dispatch on, or the refusal.
func (b *binding) usable(now time.Time) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case stateAwaitAttach:
		return 0, acperr.NewError(errcode.CodeFenced,
			"session %s is bound but not attached; call %s first", b.sessionID, acpmeta.MethodAttach)
	case stateFenced:
		if b.fenceCode == codeRefusalBudget {
			return 0, acperr.NewError(errcode.CodeFenced, "session %s is fenced for good (%s: %s); start a new session",
				b.sessionID, b.fenceCode, b.fenceWhy)
		}
		return 0, acperr.NewError(errcode.CodeFenced, "session %s is fenced (%s: %s); reattach with %s",
			b.sessionID, b.fenceCode, b.fenceWhy, acpmeta.MethodAttach)
	}
	if !now.Before(b.LeaseNotAfter) {
		return 0, acperr.NewError(errcode.CodeLeaseExpired, "session %s: lease ended at %s",
			b.sessionID, b.LeaseNotAfter.UTC().Format(time.RFC3339))
	}
	return b.epoch, nil
}

// selfAttachable reports whether the custodian may attach a plain agent's
// binding itself: it awaits its first attach, or was fenced by a transport
// loss. A binding fenced because a callback named another tuple is not:
// only an explicit `_tether/attach` lifts that fence.
func (b *binding) selfAttachable() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == stateAwaitAttach || b.state == stateFenced && b.fenceCode == errcode.CodeFateUnknown
}

// fence moves an attached binding to fenced; it reports whether the state
// changed (so the fence is audited once).
func (b *binding) fence(code errcode.Code, why string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == stateFenced {
		return false
	}
	b.state, b.fenceCode, b.fenceWhy = stateFenced, code, why
	return true
}

// fenceEpoch fences the binding if it was attached on epoch.
func (b *binding) fenceEpoch(epoch uint64, why string) bool {
	b.mu.Lock()
	attachedHere := b.state == stateActive && b.epoch == epoch
	b.mu.Unlock()
	return attachedHere && b.fence(errcode.CodeFateUnknown, why)
}

// attached records a confirmed attach on epoch.
func (b *binding) attached(epoch, gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fenceCode == codeRefusalBudget {
		return
	}
	b.state, b.epoch, b.grantGen, b.fenceCode, b.fenceWhy = stateActive, epoch, gen, "", ""
}

func (b *binding) lease() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.LeaseNotAfter
}

// extend applies a same-tuple lease extension.
func (b *binding) extend(notAfter time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	next, err := admission.Lease{Tuple: b.Tuple, NotAfter: b.LeaseNotAfter}.Extend(
		admission.Lease{Tuple: b.Tuple, NotAfter: notAfter})
	if err != nil {
		return err
	}
	b.LeaseNotAfter = next.NotAfter
	return nil
}

func (b *binding) addTerminalIfAbsent(id string, t *terminal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.terminals[id]; !ok {
		b.terminals[id] = t
	}
}

func (b *binding) terminal(id string) (*terminal, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.terminals[id]
	return t, ok
}

// markReleased keeps a released terminal known, so a repeated release or
// kill is answered without error, forgetting the oldest beyond
// maxReleasedKept.
func (b *binding) markReleased(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.released = append(b.released, id)
	if len(b.released) > maxReleasedKept {
		delete(b.terminals, b.released[0])
		b.released = b.released[1:]
	}
}
