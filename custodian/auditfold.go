package custodian

import (
	"strings"
	"sync"
	"time"

	"github.com/tetherdev/tether/custodian/audit"
)

// Permission requests and confirmed attaches are one audit record each,
// and an agent can send them as fast as it can write (refused attaches
// are refusals, counted in custodian/binding). So each session has a fold per
// method, and the permission requests of sessions not bound on a
// connection share that connection's: in each window of
// Options.RefusalRecordEvery, which the first record opens, the first
// Options.AuditBudget records are written one by one; the rest are
// counted per outcome and written as one record of kind folded (per
// outcome a count and the time of the first and last) when the window
// ends, when the session ends, and before every signed checkpoint. A
// flood of any length in one window is then at most AuditBudget+1
// records.

// DefaultAuditBudget is the default of Options.AuditBudget.
const DefaultAuditBudget = 32

// auditFold folds the records of one method of one session (or of the
// sessions not bound on one connection).
type auditFold struct {
	c    *Custodian
	head audit.Record // the folded record's session, tuple, principal and method

	mu       sync.Mutex
	inWindow int // records written one by one in the current window
	folded   map[string]*audit.FoldCount
	timer    *time.Timer // ends the current window, if one is open
	closed   bool
}

// newFold returns a fold whose records carry head's session, tuple,
// principal and method; it is flushed before every checkpoint until end.
func (c *Custodian) newFold(head audit.Record) *auditFold {
	f := &auditFold{c: c, head: audit.Record{Kind: audit.KindFolded, SessionID: head.SessionID, TupleSHA256: head.TupleSHA256,
		Principal: head.Principal, Method: head.Method}, folded: map[string]*audit.FoldCount{}}
	c.tallyMu.Lock()
	c.folds[f] = struct{}{}
	c.tallyMu.Unlock()
	return f
}

// record writes r, or, past the window's budget, counts it; with the
// budget off (negative) it always writes r.
func (f *auditFold) record(r audit.Record) {
	budget := f.c.opts.AuditBudget
	if budget < 0 {
		f.c.audit(r)
		return
	}
	now := f.c.now().UTC()
	f.mu.Lock()
	if f.timer == nil && !f.closed {
		f.timer = time.AfterFunc(f.c.opts.RefusalRecordEvery, f.endWindow)
	}
	if f.inWindow < budget && !f.closed {
		f.inWindow++
		f.mu.Unlock()
		f.c.audit(r)
		return
	}
	f.countLocked(foldKey(r), now)
	closed := f.closed
	f.mu.Unlock()
	if closed { // a call still in flight when its session ended
		f.flush()
	}
}

// foldKey names what a folded record counts r under: its outcome (or its
// kind), its code and who tagged it.
func foldKey(r audit.Record) string {
	key := []string{r.Outcome}
	if r.Outcome == "" {
		key[0] = string(r.Kind)
	}
	for _, s := range []string{r.Code, r.TaggedBy} {
		if s != "" {
			key = append(key, s)
		}
	}
	return strings.Join(key, "/")
}

// countLocked counts one record under key at now; f.mu is held.
func (f *auditFold) countLocked(key string, now time.Time) {
	n := f.folded[key]
	if n == nil {
		n = &audit.FoldCount{First: now}
		f.folded[key] = n
	}
	n.Count++
	n.Last = now
}

// endWindow writes what the window folded and opens the next window
// with the next record.
func (f *auditFold) endWindow() {
	f.mu.Lock()
	f.inWindow, f.timer = 0, nil
	f.mu.Unlock()
	f.flush()
}

// flush writes what was folded since the last folded record, if anything.
func (f *auditFold) flush() {
	f.mu.Lock()
	folded := f.folded
	f.folded = map[string]*audit.FoldCount{}
	f.mu.Unlock()
	if len(folded) == 0 {
		return
	}
	r := f.head
	r.Folded = make(map[string]audit.FoldCount, len(folded))
	for k, n := range folded {
		r.Folded[k] = *n
	}
	f.c.audit(r)
}

// end writes what is still folded and stops the fold (its session or
// connection ended).
func (f *auditFold) end() {
	f.mu.Lock()
	f.closed = true
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	f.mu.Unlock()
	f.flush()
	f.c.tallyMu.Lock()
	delete(f.c.folds, f)
	f.c.tallyMu.Unlock()
}

// flushFolds writes every fold's pending records (before a checkpoint and
// at Close).
func (c *Custodian) flushFolds() {
	c.tallyMu.Lock()
	all := make([]*auditFold, 0, len(c.folds))
	for f := range c.folds {
		all = append(all, f)
	}
	c.tallyMu.Unlock()
	for _, f := range all {
		f.flush()
	}
}

// fold returns b's fold of method, made on first use.
func (b *session) fold(c *Custodian, method string) *auditFold {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.folds == nil {
		b.folds = map[string]*auditFold{}
	}
	f := b.folds[method]
	if f == nil {
		f = c.newFold(audit.Record{SessionID: b.ID, TupleSHA256: b.Digest, Principal: b.Principal, Method: method})
		b.folds[method] = f
	}
	return f
}

// endFolds writes and stops b's folds.
func (b *session) endFolds() {
	b.mu.Lock()
	folds := b.folds
	b.mu.Unlock()
	for _, f := range folds {
		f.end()
	}
}
