package binding

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
)

// State is where a binding is in its life.
type State int

const (
	// StateAwaitAttach: the bind was sent; nothing is dispatched until the
	// agent's `_tether/attach` is confirmed by the receiver.
	StateAwaitAttach State = iota
	// StateActive: callbacks are dispatched on the attach's epoch.
	StateActive
	// StateFenced: transport loss, a tuple mismatch or lease expiry;
	// nothing is dispatched until `_tether/attach` succeeds again.
	StateFenced
)

func (s State) String() string {
	return [...]string{"awaiting attach", "active", "fenced"}[s]
}

// Spec is what a session is bound to, as far as this package decides on
// it: the immutable tuple, the lease, the principal it acts for, and
// whether the agent is plain (the custodian tags and attaches for it).
type Spec struct {
	Tuple         admission.Tuple
	LeaseNotAfter time.Time
	Principal     string
	Plain         bool
}

// Session is one row of a connection's binding table, made when its
// session id is known. ID, Tuple, Digest, Principal, Plain and Local
// never change after the row is made; the state, the lease, the epoch and
// the fencing token change only through this package.
type Session struct {
	ID        string
	Tuple     admission.Tuple
	Digest    string // Tuple.SHA256()
	Principal string
	Plain     bool
	// Local is the embedder's own state of the session (the custodian's
	// receiver, terminals and audit folds), made with the row, before the
	// row is in a table.
	Local any

	mu        sync.Mutex
	lease     time.Time
	state     State
	fenceCode errcode.Code
	fenceWhy  string
	epoch     uint64
	grantGen  uint64
	refusals  *tally // made at the first refusal (refusals.go)

	// token is the fencing token this custodian holds for the session in
	// the fleet's op store (0: none, the single-machine store, or not
	// claimed yet); every receiver request carries it. claimMu makes
	// one claim at a time.
	token   atomic.Uint64
	claimMu sync.Mutex
}

func newSession(sessionID string, s Spec, local func(*Session) any) *Session {
	ns := &Session{ID: sessionID, Tuple: s.Tuple, Digest: s.Tuple.SHA256(), Principal: s.Principal, Plain: s.Plain,
		lease: s.LeaseNotAfter, state: StateAwaitAttach}
	ns.Local = local(ns)
	return ns
}

// FenceToken returns the fencing token the session's requests carry.
func (s *Session) FenceToken() uint64 { return s.token.Load() }

// Claimed runs claim under the session's claim lock unless the session
// holds a token already; a claim that returns a token > 0 stores it.
func (s *Session) Claimed(claim func() (uint64, error)) error {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	if s.token.Load() != 0 {
		return nil
	}
	tok, err := claim()
	if err == nil {
		s.token.Store(tok)
	}
	return err
}

// State returns the session's state.
func (s *Session) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Lease returns the lease's end.
func (s *Session) Lease() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease
}

// Shorten ends the lease at notAfter if that is earlier; a lease is never
// lengthened here (extend). Tests of the lease's end use it.
func (s *Session) Shorten(notAfter time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if notAfter.Before(s.lease) {
		s.lease = notAfter
	}
}

// extend applies a same-tuple lease extension.
func (s *Session) extend(notAfter time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := admission.Lease{Tuple: s.Tuple, NotAfter: s.lease}.Extend(
		admission.Lease{Tuple: s.Tuple, NotAfter: notAfter})
	if err != nil {
		return err
	}
	s.lease = next.NotAfter
	return nil
}

// fence moves an attached binding to fenced; it reports whether the state
// changed (so the fence is audited once).
func (s *Session) fence(code errcode.Code, why string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == StateFenced {
		return false
	}
	s.state, s.fenceCode, s.fenceWhy = StateFenced, code, why
	return true
}

// fenceEpoch fences the binding if it was attached on epoch.
func (s *Session) fenceEpoch(epoch uint64, why string) bool {
	s.mu.Lock()
	attachedHere := s.state == StateActive && s.epoch == epoch
	s.mu.Unlock()
	return attachedHere && s.fence(errcode.CodeFateUnknown, why)
}

// attached records a confirmed attach on epoch.
func (s *Session) attached(epoch, gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenceCode == CodeRefusalBudget {
		return
	}
	s.state, s.epoch, s.grantGen, s.fenceCode, s.fenceWhy = StateActive, epoch, gen, "", ""
}

// reload applies a session/load of s bound as b: b must name the same
// tuple (else ErrTupleChanged), a later lease is taken, and an active
// session must reattach.
func (s *Session) reload(b Spec) error {
	if !s.Tuple.Equal(b.Tuple) {
		return fmt.Errorf("%w: session %q is bound to tuple %s; %w", ErrBind, s.ID, s.Digest, admission.ErrTupleChanged)
	}
	if b.LeaseNotAfter.After(s.Lease()) {
		if err := s.extend(b.LeaseNotAfter); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == StateActive {
		s.state = StateAwaitAttach
	}
	return nil
}
