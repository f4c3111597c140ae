package custodian

import (
	"strconv"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
)

// Refusals are not one audit record each: an agent can cause them as
// fast as it can send callbacks. Each session counts its own (a
// refusalTally); one refusals record per session gives, per code, how
// many there were and the first and last of them, written at most once
// per Options.RefusalRecordEvery, when the session ends, when it is
// fenced for its refusal budget, and before every signed checkpoint. A
// session whose refusals pass Options.RefusalBudget is fenced for good
// (codeRefusalBudget), and that fence is recorded.

// Defaults of the refusal options.
const (
	DefaultRefusalBudget      = 1000
	DefaultRefusalRecordEvery = 5 * time.Second
)

// codeRefusalBudget is the fence code (in the binding and in its fence
// record) of a session that passed its refusal budget.
const codeRefusalBudget errcode.Code = "refusal_budget"

// refusalTally counts the refusals of one session (sessionID set) or of
// the sessions not bound on one ACP connection (sessionID "").
type refusalTally struct {
	c         *Custodian
	sessionID string
	tuple     string
	principal string

	mu     sync.Mutex
	total  int64 // since the tally began
	codes  map[string]*audit.RefusalCount
	timer  *time.Timer // pending record, if any
	closed bool
}

func (c *Custodian) newTally(sessionID, tuple, principal string) *refusalTally {
	rt := &refusalTally{c: c, sessionID: sessionID, tuple: tuple, principal: principal, codes: map[string]*audit.RefusalCount{}}
	c.tallyMu.Lock()
	c.tallies[rt] = struct{}{}
	c.tallyMu.Unlock()
	return rt
}

// add counts one refusal and returns the tally's total. The first refusal
// since the last record arms the timer of the next one; on an ended tally
// (a call still in flight when its session ended) the record is written
// at once.
func (rt *refusalTally) add(code errcode.Code, ev audit.RefusalEvent) int64 {
	if ev.Time.IsZero() {
		ev.Time = rt.c.now().UTC()
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
func (rt *refusalTally) countLocked(code errcode.Code, ev audit.RefusalEvent) int64 {
	rt.total++
	n := rt.codes[string(code)]
	if n == nil {
		n = &audit.RefusalCount{First: ev}
		rt.codes[string(code)] = n
	}
	n.Count++
	n.Last = ev
	if rt.timer == nil && !rt.closed {
		rt.timer = time.AfterFunc(rt.c.opts.RefusalRecordEvery, rt.flush)
	}
	return rt.total
}

// flush writes the refusals counted since the last record, if any.
func (rt *refusalTally) flush() {
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
	rt.c.audit(r)
}

// end writes what is still counted and stops the tally (its session
// ended).
func (rt *refusalTally) end() {
	rt.mu.Lock()
	rt.closed = true
	rt.mu.Unlock()
	rt.flush()
	rt.c.tallyMu.Lock()
	delete(rt.c.tallies, rt)
	rt.c.tallyMu.Unlock()
}

// flushRefusals writes every tally's pending refusals (before a
// checkpoint and at Close).
func (c *Custodian) flushRefusals() {
	c.flushFolds()
	c.tallyMu.Lock()
	all := make([]*refusalTally, 0, len(c.tallies))
	for rt := range c.tallies {
		all = append(all, rt)
	}
	c.tallyMu.Unlock()
	for _, rt := range all {
		rt.flush()
	}
}

// refusedBound counts a refusal of bound session b and fences b, once,
// when its total passes the refusal budget.
func (c *Custodian) refusedBound(b *binding, code errcode.Code, ev audit.RefusalEvent) {
	rt := b.tally(c)
	total := rt.add(code, ev)
	if c.opts.RefusalBudget < 0 || total <= int64(c.opts.RefusalBudget) {
		return
	}
	if b.fenceForBudget(total) {
		rt.flush() // the record of what led to the fence comes first
		c.auditFence(b, codeRefusalBudget)
	}
}

// tally returns b's refusal tally, made on first use.
func (b *binding) tally(c *Custodian) *refusalTally {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refusals == nil {
		b.refusals = c.newTally(b.sessionID, b.digest, b.Principal)
	}
	return b.refusals
}

// endTally writes and stops b's refusal tally, if it has one.
func (b *binding) endTally() {
	b.mu.Lock()
	rt := b.refusals
	b.mu.Unlock()
	if rt != nil {
		rt.end()
	}
}

// fenceForBudget fences b for good; it reports whether this call did.
func (b *binding) fenceForBudget(total int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fenceCode == codeRefusalBudget {
		return false
	}
	b.state, b.fenceCode = stateFenced, codeRefusalBudget
	b.fenceWhy = "it caused " + strconv.FormatInt(total, 10) + " refusals, over its budget"
	return true
}

// overBudget reports whether b was fenced for its refusal budget: no
// attach lifts that fence.
func (b *binding) overBudget() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fenceCode == codeRefusalBudget
}

// refused counts a refusal on this connection: of its bound session b,
// or, with b nil, of a session not bound here.
func (cn *Conn) refused(b *binding, code errcode.Code, ev audit.RefusalEvent) {
	if b != nil {
		cn.c.refusedBound(b, code, ev)
		return
	}
	cn.unbound.add(code, ev)
}
