package custodian

import (
	"fmt"
	"strings"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// A retry of terminal/create with the same op key and arguments as a
// finished command is answered from the command's receipt: create returns
// the terminal id the first call returned, and that id is then a replay
// handle in this session, whether the terminal was released here or never
// existed on this custodian (another one ran it before a takeover).
// wait_for_exit and output on it answer the exit and the final output the
// receipt keeps; kill and release send nothing (their own keys replay
// their own receipts). Nothing reaches the receiver.

// noteOutputNotKept explains a finished exec's receipt whose final output
// was too large to keep in it: a replay answers its exit, not its output.
const noteOutputNotKept = "final output of %d bytes not kept for replay: the receipt would pass its size bound"

// keepOutput puts f's output into r, a receipt being completed, unless r
// would then pass the store's bound (then note says so). A plain agent's
// receipt keeps none: its key was minted by the custodian for that
// request alone, and no retry can name it.
func keepOutput(r *opstore.Receipt, f *wire.ExecOutputResult) {
	if f == nil || r.TaggedBy == TaggedByCustodian {
		return
	}
	r.Output = &opstore.ExecOutput{Output: f.Output, Truncated: f.Truncated}
	if r.Fits() {
		return
	}
	r.Output = nil
	note := fmt.Sprintf(noteOutputNotKept, len(f.Output))
	if r.Note != "" {
		note = r.Note + "; " + note
	}
	r.Note = note
}

// replayTerminal is the replay handle of the finished command r records:
// its final output (when kept) answers output and wait_for_exit, it is
// gone from the receiver and its receipt is final.
func replayTerminal(createKey string, r *opstore.Receipt) *terminal {
	exit := wireExit(r.Exit)
	t := &terminal{createKey: createKey, recorded: true, goneRemote: true, replayOf: r, exit: exit}
	if exit != nil && r.Output != nil {
		t.final = &wire.ExecOutputResult{Output: r.Output.Output, Truncated: r.Output.Truncated, Exit: exit}
	}
	return t
}

// addReplayTerminal makes t the session's terminal id, unless the session
// holds that terminal unreleased (the first call's terminal is still
// here: it answers as it did).
func (b *session) addReplayTerminal(id string, t *terminal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.terminals[id]; ok {
		if released, inFlight := old.releaseState(); !released && !inFlight {
			return
		}
	}
	b.terminals[id] = t
}

// replayLacks refuses a wait_for_exit or output on replay handle t whose
// receipt does not keep what it asks for (what: "exit" or "output");
// nothing is sent.
func (cl *call) replayLacks(t *terminal, id, what string) error {
	r := t.replayOf
	code := errcode.CodeNotFound
	if strings.Contains(r.Note, "not kept for replay") {
		code = errcode.CodeTooLarge
	}
	cl.Refuse(code)
	return acperr.NewError(code, "terminal %q answers a retry of op key %s from its receipt (%s: %s), which keeps no %s; nothing was run again",
		id, r.OpKey, r.Outcome, r.Note, what)
}
