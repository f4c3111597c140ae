package binding

import (
	"strconv"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
)

// Refusals are not one audit record each: an agent can cause them as
// fast as it can send callbacks. Each session counts its own (a tally);
// one refusals record per session gives, per code, how many there were
// and the first and last of them, written at most once per
// Config.RefusalRecordEvery, when the session ends, when it is fenced for
// its refusal budget, and before every signed checkpoint (Keeper.Flush).
// A session whose refusals pass Config.RefusalBudget is fenced for good
// (CodeRefusalBudget), and that fence is recorded.

// CodeRefusalBudget is the fence code (in the session and in its fence
// record) of a session that passed its refusal budget.
const CodeRefusalBudget errcode.Code = "refusal_budget"

// tally counts the refusals of one session (sessionID set) or of the
// sessions not bound on one ACP connection (sessionID "").
type tally struct {
	k         *Keeper
	sessionID string
	tuple     string
	principal string

	mu     sync.Mutex
	total  int64 // since the tally began
	codes  map[string]*audit.RefusalCount
	timer  *time.Timer // pending record, if any
	closed bool
}

func (k *Keeper) newTally(sessionID, tuple, principal string) *tally {
	rt := &tally{k: k, sessionID: sessionID, tuple: tuple, principal: principal, codes: map[string]*audit.RefusalCount{}}
	k.mu.Lock()
	k.tallies[rt] = struct{}{}
	k.mu.Unlock()
	return rt
}

// add counts one refusal and returns the tally's total. The first refusal
// since the last record arms the timer of the next one; on an ended tally
// (a call still in flight when its session ended) the record is written
// at once.
func (rt *tally) add(code errcode.Code, ev audit.RefusalEvent) int64 {
	if ev.Time.IsZero() {
		ev.Time = rt.k.h.Now().UTC()
	}
	rt.mu.Lock()
	total, ended := rt.countLocked(code, ev), rt.closed
	rt.mu.Unlock()
	if ended {
		rt.flush()
	}
	return total
}

// countLocked counts ev under code; rt.mu is held.
func (rt *tally) countLocked(code errcode.Code, ev audit.RefusalEvent) int64 {
	rt.total++
	n := rt.codes[string(code)]
	if n == nil {
		n = &audit.RefusalCount{First: ev}
		rt.codes[string(code)] = n
	}
	n.Count++
	n.Last = ev
	if rt.timer == nil && !rt.closed {
		rt.timer = time.AfterFunc(rt.k.cfg.RefusalRecordEvery, rt.flush)
	}
	return rt.total
}

// flush writes the refusals counted since the last record, if any.
func (rt *tally) flush() {
	rt.mu.Lock()
	codes := rt.codes
	rt.codes = map[string]*audit.RefusalCount{}
	if rt.timer != nil {
		rt.timer.Stop()
		rt.timer = nil
	}
	rt.mu.Unlock()
	if len(codes) == 0 {
		return
	}
	r := audit.Record{Kind: audit.KindRefusals, SessionID: rt.sessionID, TupleSHA256: rt.tuple, Principal: rt.principal,
		Refusals: make(map[string]audit.RefusalCount, len(codes))}
	for code, n := range codes {
		r.Refusals[code] = *n
	}
	rt.k.h.Audit(r)
}

// end writes what is still counted and stops the tally (its session
// ended).
func (rt *tally) end() {
	rt.mu.Lock()
	rt.closed = true
	rt.mu.Unlock()
	rt.flush()
	rt.k.mu.Lock()
	delete(rt.k.tallies, rt)
	rt.k.mu.Unlock()
}

// Flush writes every tally's pending refusals (before a checkpoint and
// at the custodian's Close).
func (k *Keeper) Flush() {
	k.mu.Lock()
	all := make([]*tally, 0, len(k.tallies))
	for rt := range k.tallies {
		all = append(all, rt)
	}
	k.mu.Unlock()
	for _, rt := range all {
		rt.flush()
	}
}

// refusedBound counts a refusal of bound session s and fences s, once,
// when its total passes the refusal budget.
func (k *Keeper) refusedBound(s *Session, code errcode.Code, ev audit.RefusalEvent) {
	rt := s.tally(k)
	total := rt.add(code, ev)
	if k.cfg.RefusalBudget < 0 || total <= int64(k.cfg.RefusalBudget) {
		return
	}
	if s.fenceForBudget(total) {
		rt.flush() // the record of what led to the fence comes first
		k.auditFence(s, CodeRefusalBudget)
	}
}

// tally returns s's refusal tally, made on first use.
func (s *Session) tally(k *Keeper) *tally {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refusals == nil {
		s.refusals = k.newTally(s.ID, s.Digest, s.Principal)
	}
	return s.refusals
}

// endTally writes and stops s's refusal tally, if it has one.
func (s *Session) endTally() {
	s.mu.Lock()
	rt := s.refusals
	s.mu.Unlock()
	if rt != nil {
		rt.end()
	}
}

// fenceForBudget fences s for good; it reports whether this call did.
func (s *Session) fenceForBudget(total int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenceCode == CodeRefusalBudget {
		return false
	}
	s.state, s.fenceCode = StateFenced, CodeRefusalBudget
	s.fenceWhy = "it caused " + strconv.FormatInt(total, 10) + " refusals, over its budget"
	return true
}

// overBudget reports whether s was fenced for its refusal budget: no
// attach lifts that fence.
func (s *Session) overBudget() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenceCode == CodeRefusalBudget
}

// Refused counts a refusal on this table's connection: of its bound
// session s, or, with s nil, of a session not bound here. The caller
// decided nothing: the code is one this package or a check of the
// request's own content (a path, an argument) named.
func (t *Table) Refused(s *Session, code errcode.Code, ev audit.RefusalEvent) {
	if s != nil {
		t.k.refusedBound(s, code, ev)
		return
	}
	t.unbound.add(code, ev)
}
