package qmpinput

import (
	"fmt"
	"sync"
	"time"
)

// MaxHandoverTTL bounds one handover.
const MaxHandoverTTL = time.Hour

// EndReason says why a handover ended.
type EndReason string

// End reasons.
const (
	EndExplicit EndReason = "explicit" // Hold.End
	EndTTL      EndReason = "ttl"      // the TTL passed
	EndRevoked  EndReason = "revoked"  // Hold.Revoke or Handover.Revoke
	EndClosed   EndReason = "closed"   // Adapter.Close
	// EndDisconnected: the person's connection closed (the live view ends
	// a hold when the holder's WebSocket closes).
	EndDisconnected EndReason = "disconnected"
)

// AuditEvent records a handover beginning or ending. It never carries
// what was typed or shown.
type AuditEvent struct {
	Kind     string        `json:"kind"` // "handover_begin" or "handover_end"
	Actor    string        `json:"actor"`
	Scope    string        `json:"scope"` // what was fenced, on which display
	Begun    time.Time     `json:"begun"`
	TTL      time.Duration `json:"ttl"`
	Duration time.Duration `json:"duration,omitempty"` // set on end
	Reason   EndReason     `json:"reason,omitempty"`   // set on end
}

// Handover lets one party (a person) hold input: while a Hold is active,
// agent input fails with ErrFenced and agent captures with ErrMasked.
type Handover struct {
	a   *Adapter
	mu  sync.Mutex
	cur *Hold
}

// Hold is one active handover. It ends once: by End, Revoke, its TTL or
// Adapter.Close.
type Hold struct {
	h     *Handover
	actor string
	begun time.Time
	ttl   time.Duration
	tmu   sync.Mutex
	timer *time.Timer
	begin chan struct{} // closed once the begin record is out
	// release, if set, runs once when the hold ends, before the fence
	// lifts: the person's own input stops before the agent's resumes.
	release func(EndReason)
	once    sync.Once
	done    chan struct{}
	why     EndReason
}

// Handover returns the adapter's handover control.
func (a *Adapter) Handover() *Handover { return &a.handover }

// Begin fences agent input and masks agent captures for at most ttl on
// behalf of actor. It returns once no agent command is in flight. The
// pixel space of the last capture is dropped: after the handover the agent
// must capture again before it points anywhere.
func (h *Handover) Begin(ttl time.Duration, actor string) (*Hold, error) {
	return h.BeginWith(ttl, actor, nil)
}

// BeginWith is Begin with a release function that runs exactly once when
// the hold ends (by any route), before agent input is unfenced. The live
// view uses it to stop the person's input and lift their held keys first,
// so the two parties never hold input at the same time. release must not
// end the hold itself.
func (h *Handover) BeginWith(ttl time.Duration, actor string, release func(EndReason)) (*Hold, error) {
	if h.a.cfg.Audit == nil {
		return nil, fmt.Errorf("%w: a handover needs an Audit callback", ErrConfig)
	}
	if ttl <= 0 || ttl > MaxHandoverTTL {
		return nil, fmt.Errorf("%w: handover ttl %v outside (0, %v]", ErrConfig, ttl, MaxHandoverTTL)
	}
	if err := checkActor(actor); err != nil {
		return nil, err
	}
	h.mu.Lock()
	if h.cur != nil {
		actor := h.cur.actor
		h.mu.Unlock()
		return nil, fmt.Errorf("%w (held by %s)", ErrHandoverActive, actor)
	}
	hold := &Hold{h: h, actor: actor, begun: h.a.now(), ttl: ttl, done: make(chan struct{}), begin: make(chan struct{}), release: release}
	h.cur = hold
	h.mu.Unlock()
	// Wait out the in-flight agent operation; it stops at its next gate.
	h.a.opMu.Lock()
	h.a.space.Store(nil)
	h.a.opMu.Unlock()
	h.a.cfg.Audit(hold.event("handover_begin"))
	close(hold.begin)
	hold.tmu.Lock()
	hold.timer = time.AfterFunc(ttl-h.a.now().Sub(hold.begun), func() { hold.end(EndTTL) })
	hold.tmu.Unlock()
	return hold, nil
}

// Revoke ends the current handover, if any, as revoked.
func (h *Handover) Revoke() { h.endCurrent(EndRevoked) }

func (h *Handover) endCurrent(why EndReason) {
	h.mu.Lock()
	cur := h.cur
	h.mu.Unlock()
	if cur != nil {
		cur.end(why)
	}
}

func (h *Handover) active() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		return "", false
	}
	return h.cur.actor, true
}

// End ends the handover explicitly.
func (o *Hold) End() { o.end(EndExplicit) }

// Revoke ends the handover as revoked.
func (o *Hold) Revoke() { o.end(EndRevoked) }

// EndWith ends the handover for the given reason (for example
// EndDisconnected).
func (o *Hold) EndWith(why EndReason) { o.end(why) }

// Done is closed when the handover has ended.
func (o *Hold) Done() <-chan struct{} { return o.done }

// Reason says why the handover ended; "" while it is active.
func (o *Hold) Reason() EndReason {
	select {
	case <-o.done:
		return o.why
	default:
		return ""
	}
}

func (o *Hold) end(why EndReason) {
	o.once.Do(func() {
		<-o.begin // the end record never precedes the begin record
		o.tmu.Lock()
		if o.timer != nil {
			o.timer.Stop()
		}
		o.tmu.Unlock()
		if o.release != nil {
			o.release(why)
		}
		o.why = why
		ev := o.event("handover_end")
		ev.Duration, ev.Reason = o.h.a.now().Sub(o.begun), why
		o.h.a.cfg.Audit(ev)
		// The fence lifts only once the end is recorded, so the agent's
		// next action always follows the end record.
		o.h.mu.Lock()
		if o.h.cur == o {
			o.h.cur = nil
		}
		o.h.mu.Unlock()
		close(o.done)
	})
}

func (o *Hold) event(kind string) AuditEvent {
	d := o.h.a.cfg.Display
	return AuditEvent{Kind: kind, Actor: o.actor, Begun: o.begun, TTL: o.ttl,
		Scope: fmt.Sprintf("input+capture display=%s/%d", d.Device, d.Head)}
}
