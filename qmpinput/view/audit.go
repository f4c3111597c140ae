package view

import (
	"fmt"
	"sync"

	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/auditlog"
)

// Auditor turns the adapter's handover and pause records into audit log
// lines with the actor's role and token. Create it before the adapter and
// give Record to qmpinput.Config.Audit; give the Auditor to Config.
type Auditor struct {
	log *auditlog.Log

	mu     sync.Mutex
	actors map[string]actorInfo // actor name -> role and token
	err    error                // first append failure not yet collected
}

type actorInfo struct{ role, token string }

// NewAuditor returns an Auditor appending to log.
func NewAuditor(log *auditlog.Log) *Auditor {
	return &Auditor{log: log, actors: map[string]actorInfo{}}
}

// bind remembers the role and token behind an actor name.
func (au *Auditor) bind(actor, role, tokenID string) {
	au.mu.Lock()
	au.actors[actor] = actorInfo{role, tokenID}
	au.mu.Unlock()
}

var kindOf = map[string]string{"handover_begin": auditlog.KindHandoverBegin, "handover_end": auditlog.KindHandoverEnd,
	"pause": auditlog.KindPause, "resume": auditlog.KindResume}

// Record appends one adapter event. It is qmpinput.Config.Audit's
// callback, which cannot fail: a failed append is kept for takeErr, so
// the arbiter can undo a takeover whose begin was not recorded.
func (au *Auditor) Record(e qmpinput.AuditEvent) {
	au.mu.Lock()
	info := au.actors[e.Actor]
	au.mu.Unlock()
	kind, ok := kindOf[e.Kind]
	var err error
	if !ok {
		err = fmt.Errorf("%w: adapter event %q", auditlog.ErrRecord, e.Kind)
	} else {
		_, err = au.log.Append(auditlog.Record{Kind: kind, Actor: e.Actor, Role: info.role, Token: info.token,
			Scope: e.Scope, TTLMillis: e.TTL.Milliseconds(), DurMillis: e.Duration.Milliseconds(), Reason: string(e.Reason)})
	}
	if err != nil {
		au.mu.Lock()
		if au.err == nil {
			au.err = err
		}
		au.mu.Unlock()
	}
}

// viewerOpened records that v opened the view. A viewer whose opening
// cannot be recorded is refused.
func (au *Auditor) viewerOpened(v *viewer) error {
	_, err := au.log.Append(auditlog.Record{Kind: auditlog.KindViewerOpen, Actor: v.actor, Role: string(v.role), Token: v.tokenID,
		Scope: "viewer " + v.id})
	return err
}

// viewerClosed records that v closed, and why.
func (au *Auditor) viewerClosed(v *viewer, reason string) error {
	_, err := au.log.Append(auditlog.Record{Kind: auditlog.KindViewerClose, Actor: v.actor, Role: string(v.role), Token: v.tokenID,
		Scope: "viewer " + v.id, Reason: clipReason(reason)})
	return err
}

// clipReason keeps a close reason within the log's field bound.
func clipReason(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}

// takeErr returns and clears the first failed append.
func (au *Auditor) takeErr() error {
	au.mu.Lock()
	defer au.mu.Unlock()
	err := au.err
	au.err = nil
	return err
}
