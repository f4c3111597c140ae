package custodian

import (
	"context"
	"errors"
	"time"

	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// An exec's receipt is pending until the custodian observes the child's
// exit. Whichever call observes it first records it, at that moment and
// without depending on the agent's request any further: wait_for_exit
// (the exit and the after-exit digests), output showing the exit, or
// release. Only an exit never observed before the release leaves the
// receipt failed without one.

// noteDigestsNotFetched explains a receipt completed from an exit that
// terminal/output showed when the digests it asked for could not be
// fetched before the release.
const noteDigestsNotFetched = "exit observed by terminal/output; its after-exit digests were never fetched"

// noteReleasedUnobserved explains a receipt completed by a release with no
// exit observed.
const noteReleasedUnobserved = "released before its exit was observed"

// recordExit completes t's receipt from an observed exit and the digests
// the receiver computed after it (nil when none were fetched). A receipt
// already final is left as it is.
func (c *Custodian) recordExit(t *terminal, exit wire.ExitStatus, hashes map[string]string, note string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exit == nil {
		t.exit = &exit
	}
	outcome, checks := execOutcome(exit, t.expect, hashes)
	c.completeLocked(t, func(r *opstore.Receipt) {
		r.Outcome, r.Files, r.Note = outcome, checks, note
		r.Exit = receiptExit(exit)
		keepOutput(r, t.final)
	})
}

// receiptExit is the receipt's copy of the receiver's exit status. The
// conversion compiles only while the two types have the same fields, so a
// field added to either one fails the build here instead of being dropped.
func receiptExit(e wire.ExitStatus) *opstore.ExitStatus {
	r := opstore.ExitStatus(e)
	return &r
}

// wireExit is the exit status a receipt records, in the receiver's type the
// terminal's answers use; nil when the receipt records none.
func wireExit(e *opstore.ExitStatus) *wire.ExitStatus {
	if e == nil {
		return nil
	}
	w := wire.ExitStatus(*e)
	return &w
}

// observe remembers an exit that is not recorded yet (its digests are
// still to be fetched), so a release in between still records it.
func (t *terminal) observe(exit wire.ExitStatus) (recorded bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exit == nil {
		t.exit = &exit
	}
	return t.recorded
}

// recordOutputExit records the exit terminal/output showed. With nothing
// to verify the exit is the whole outcome; otherwise the answer carries
// the after-exit digests, and only when they did not fit in it does
// exec_wait (which answers at once for an exited child) fetch them. The
// fetch does not depend on the agent's request: a cancel arriving now must
// not lose what was observed.
func (cl *call) recordOutputExit(ctx context.Context, t *terminal, id string, out *wire.ExecOutputResult) {
	exit := *out.Exit
	if len(t.expect) == 0 || out.FileSHA256 != nil {
		cl.c.recordExit(t, exit, out.FileSHA256, "")
		return
	}
	if t.observe(exit) {
		return
	}
	var res wire.ExecWaitResult
	err := cl.readOnly(context.WithoutCancel(ctx), wire.OpExecWait, &wire.TerminalArgs{TerminalID: id}, &res, exitAnnotate(&res.Exit))
	if err == nil {
		cl.c.recordExit(t, res.Exit, res.FileSHA256, "")
	}
}

// recordRelease completes t's receipt when its terminal is released: from
// the exit observed earlier if it was not recorded yet, else as failed.
func (c *Custodian) recordRelease(t *terminal) {
	t.mu.Lock()
	recorded, exit := t.recorded, t.exit
	t.mu.Unlock()
	switch {
	case recorded:
	case exit != nil:
		c.recordExit(t, *exit, nil, noteDigestsNotFetched)
	default:
		t.mu.Lock()
		defer t.mu.Unlock()
		c.completeLocked(t, func(r *opstore.Receipt) { r.Outcome, r.Note = opstore.Failed, noteReleasedUnobserved })
	}
}

// noteUnknownAtEnd explains the receipt of a command the receiver no
// longer knew when its session ended.
const noteUnknownAtEnd = "the receiver no longer knew the terminal when the session ended (restarted, or its orphan grace ended it); its exit is unknown"

// recordUnknownAtEnd completes t's receipt, unless an exit was recorded,
// as interrupted: the command ended out of the custodian's sight.
func (c *Custodian) recordUnknownAtEnd(t *terminal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c.completeLocked(t, func(r *opstore.Receipt) { r.Outcome, r.Note = opstore.Interrupted, noteUnknownAtEnd })
}

// completeTries bounds the tries of a receipt's completion that the op
// store answered unavailable (an etcd member restarting): each is safe to
// repeat (one that landed leaves the receipt final, and the next is then
// refused as such), and a completion lost leaves a receipt that becomes
// interrupted where the agent was answered an exit.
var completeTries = []time.Duration{0, 100 * time.Millisecond, 400 * time.Millisecond}

// completeLocked finalises t's pending receipt once; called with t.mu held.
func (c *Custodian) completeLocked(t *terminal, fn func(*opstore.Receipt)) {
	if t.recorded {
		return
	}
	var err error
	for _, d := range completeTries {
		time.Sleep(d)
		if err = c.store.Complete(context.Background(), t.createKey, fn); !errors.Is(err, opstore.ErrUnavailable) {
			break
		}
	}
	switch {
	case err == nil:
		t.recorded = true
	case errors.Is(err, opstore.ErrInvalid): // already final (e.g. interrupted)
		t.recorded = true
	default:
		c.log.Error("complete exec receipt", "store_key", t.createKey, "err", err)
	}
}
