package view

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/token"
)

// Errors of the arbiter; the page shows their codes.
var (
	// ErrForbidden: the viewer's role does not allow the operation.
	ErrForbidden = errors.New("operation not allowed for this role")
	// ErrHeld: another person holds input.
	ErrHeld = errors.New("another person holds input")
	// ErrNotHolder: hand back by a viewer that does not hold input.
	ErrNotHolder = errors.New("this viewer does not hold input")
	// ErrAudit: the audit record could not be written, so the operation
	// was undone.
	ErrAudit = errors.New("audit log write failed")
)

// arbiter decides who holds input: the agent (no holder) or one viewer.
// mu is held for writing while the holder changes and for reading while
// a viewer's input is forwarded, so input never crosses a change of
// hands. Nobody calls into a Hold while holding mu: the hold's release
// function takes mu itself.
//
// What pages are told (shown) trails the holder on the way out: a hold's
// release stops the person's input at once, but pages learn that the
// agent holds input again only once the hold has completely ended (end
// recorded, agent unfenced), so no page or script acting on a state
// message finds the agent still fenced.
type arbiter struct {
	adapter *qmpinput.Adapter
	aud     *Auditor
	maxHold time.Duration
	now     func() time.Time
	changed func() // broadcast the state; called without mu
	logf    func(format string, args ...any)
	// pauseOwner, if set, alone pauses and resumes (Config.PauseOwner).
	pauseOwner string

	mu        sync.RWMutex
	holder    *viewer        // whose input passes; nil once its hold is released
	hold      *qmpinput.Hold // the hold holder's input passes under
	shown     *viewer        // the holder pages are told of
	shownHold *qmpinput.Hold // shown's hold, until it has completely ended
	since     time.Time      // of the shown hold
	expires   time.Time      // of the shown hold
	heldUntil time.Time      // when the last released hold's input stopped
}

// State is what the page shows about who holds input.
type State struct {
	Holder      string    `json:"holder"` // "" when the agent holds input
	HolderIsYou bool      `json:"holder_is_you"`
	Since       time.Time `json:"since,omitzero"`
	Expires     time.Time `json:"expires,omitzero"`
	Paused      bool      `json:"paused"`
	PausedBy    string    `json:"paused_by,omitempty"`
	PausedSince time.Time `json:"paused_since,omitzero"`
	// PauseOwner is Config.PauseOwner: set, the page offers no pause
	// or resume (only the owner pauses and resumes).
	PauseOwner string `json:"pause_owner,omitempty"`
}

func (ar *arbiter) state(v *viewer) State {
	ar.mu.RLock()
	s := State{Since: ar.since, Expires: ar.expires, HolderIsYou: ar.shown != nil && ar.shown == v, PauseOwner: ar.pauseOwner}
	if ar.shown != nil {
		s.Holder = ar.shown.actor
	}
	ar.mu.RUnlock()
	s.PausedBy, s.PausedSince, s.Paused = ar.adapter.Paused()
	return s
}

// attendedAt is when a person last held input: now while one holds
// it, the moment the last hold was released after that, zero if nobody
// has taken over.
func (ar *arbiter) attendedAt() time.Time {
	ar.mu.RLock()
	defer ar.mu.RUnlock()
	if ar.holder != nil {
		return ar.now()
	}
	return ar.heldUntil
}

// takeover gives v input: qmpinput.Handover.Begin fences the agent and
// waits out its command in flight. The hold lasts at most maxHold and
// never beyond v's token.
func (ar *arbiter) takeover(v *viewer) error {
	if v.role != token.RoleControl {
		return fmt.Errorf("%w: take over needs a control token", ErrForbidden)
	}
	ttl := min(ar.maxHold, v.expires.Sub(ar.now()))
	if ttl <= 0 {
		return fmt.Errorf("%w: the token has expired", token.ErrExpired)
	}
	ar.aud.bind(v.actor, string(v.role), v.tokenID)
	ar.staleAuditErr()
	ar.mu.Lock()
	if ar.holder != nil {
		who := ar.holder.actor
		ar.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrHeld, who)
	}
	hold, err := ar.adapter.Handover().BeginWith(ttl, v.actor, func(qmpinput.EndReason) { ar.released(v) })
	if err != nil {
		ar.mu.Unlock()
		return err
	}
	ar.holder, ar.hold, ar.since, ar.expires = v, hold, ar.now(), ar.now().Add(ttl)
	ar.shown, ar.shownHold = v, hold
	ar.mu.Unlock()
	go func() { <-hold.Done(); ar.ended(hold) }()
	if err := ar.aud.takeErr(); err != nil {
		hold.End()
		ar.staleAuditErr() // the end record of the undone hold
		return fmt.Errorf("%w: %w (take over undone)", ErrAudit, err)
	}
	ar.changed()
	return nil
}

// staleAuditErr logs and clears an append failure left by an earlier
// record (a hold's end), so it is not taken for the next operation's.
func (ar *arbiter) staleAuditErr() {
	if err := ar.aud.takeErr(); err != nil {
		ar.logf("audit record not written: %v", err)
	}
}

// released runs inside the hold's end, before the agent is unfenced: the
// holder's input stops and every key and button it holds is lifted.
// Pages are still told of the hold (ended tells them it is over).
func (ar *arbiter) released(v *viewer) {
	ar.mu.Lock()
	if ar.holder == v {
		v.releaseInput()
		ar.holder, ar.hold, ar.heldUntil = nil, nil, ar.now()
	}
	ar.mu.Unlock()
}

// ended runs once hold has completely ended (end recorded, agent
// unfenced): only now are pages told that the agent holds input.
func (ar *arbiter) ended(hold *qmpinput.Hold) {
	ar.mu.Lock()
	if ar.shownHold == hold {
		ar.shown, ar.shownHold, ar.since, ar.expires = nil, nil, time.Time{}, time.Time{}
	}
	ar.mu.Unlock()
	ar.changed()
}

// end ends v's hold, if v holds input, for why.
func (ar *arbiter) end(v *viewer, why qmpinput.EndReason) bool {
	ar.mu.RLock()
	hold := ar.hold
	holds := ar.holder == v && hold != nil
	ar.mu.RUnlock()
	if holds {
		hold.EndWith(why)
	}
	return holds
}

// handback ends v's hold explicitly.
func (ar *arbiter) handback(v *viewer) error {
	if !ar.end(v, qmpinput.EndExplicit) {
		return ErrNotHolder
	}
	return nil
}

// pause freezes the VM and fences the agent; any control viewer may.
func (ar *arbiter) pause(ctx context.Context, v *viewer) error {
	if v.role != token.RoleControl {
		return fmt.Errorf("%w: pause needs a control token", ErrForbidden)
	}
	if ar.pauseOwner != "" {
		return fmt.Errorf("%w: only %s pauses this VM", ErrForbidden, ar.pauseOwner)
	}
	ar.aud.bind(v.actor, string(v.role), v.tokenID)
	ar.staleAuditErr()
	err := ar.adapter.Pause(ctx, v.actor)
	if err == nil {
		if aerr := ar.aud.takeErr(); aerr != nil {
			ar.adapter.Resume(ctx, v.actor)
			ar.staleAuditErr() // the resume record of the undone pause
			err = fmt.Errorf("%w: %w (pause undone)", ErrAudit, aerr)
		}
	}
	ar.changed()
	return err
}

// resume unfreezes the VM; any control viewer may.
func (ar *arbiter) resume(ctx context.Context, v *viewer) error {
	if v.role != token.RoleControl {
		return fmt.Errorf("%w: resume needs a control token", ErrForbidden)
	}
	if ar.pauseOwner != "" {
		return fmt.Errorf("%w: only %s resumes this VM", ErrForbidden, ar.pauseOwner)
	}
	ar.aud.bind(v.actor, string(v.role), v.tokenID)
	err := ar.adapter.Resume(ctx, v.actor)
	ar.staleAuditErr() // a resume is never undone: the VM runs, the failure is logged
	ar.changed()
	return err
}

// gate is the rfb.Gate of one viewer: its input passes only while it
// holds input and the VM is not paused.
type gate struct {
	ar *arbiter
	v  *viewer
}

// Input implements rfb.Gate.
func (g gate) Input(send func() error) (bool, error) {
	g.ar.mu.RLock()
	defer g.ar.mu.RUnlock()
	if g.ar.holder != g.v || g.ar.hold == nil {
		return false, nil
	}
	if _, _, paused := g.ar.adapter.Paused(); paused {
		return false, nil
	}
	return true, send()
}
