package qmpinput

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/digitalocean/go-qemu/qmp/raw"
)

// pauseState is a VM frozen by Pause.
type pauseState struct {
	actor string
	since time.Time
}

// Pause freezes the VM (QMP stop) on behalf of actor and fences agent
// input until Resume: agent input fails with ErrFenced. It returns once
// no agent command is in flight and QEMU confirmed the stop; if the stop
// fails, nothing stays fenced. Pause and Resume go to Config.Audit (kind
// "pause", "resume"); Pause is refused without it, and while paused
// (ErrPaused).
func (a *Adapter) Pause(ctx context.Context, actor string) error {
	if a.cfg.Audit == nil {
		return fmt.Errorf("%w: pause needs an Audit callback", ErrConfig)
	}
	if err := checkActor(actor); err != nil {
		return err
	}
	a.pauseMu.Lock()
	defer a.pauseMu.Unlock()
	if p := a.paused.Load(); p != nil {
		return fmt.Errorf("%w (by %s)", ErrPaused, p.actor)
	}
	p := &pauseState{actor: actor, since: a.now()}
	a.paused.Store(p) // fence first, then wait out the agent's command
	a.opMu.Lock()
	err := raw.NewMonitor(a.conn.bind(ctx)).Stop()
	a.opMu.Unlock()
	if err != nil {
		a.paused.Store(nil)
		return fmt.Errorf("pause: %w", err)
	}
	a.cfg.Audit(AuditEvent{Kind: "pause", Actor: actor, Scope: "vm", Begun: p.since})
	return nil
}

// Resume unfreezes the VM (QMP cont) and lifts the pause fence. It fails
// with ErrNotPaused if Pause did not freeze it; if cont fails, the VM
// stays paused and fenced.
func (a *Adapter) Resume(ctx context.Context, actor string) error {
	if err := checkActor(actor); err != nil {
		return err
	}
	a.pauseMu.Lock()
	defer a.pauseMu.Unlock()
	p := a.paused.Load()
	if p == nil {
		return ErrNotPaused
	}
	if err := raw.NewMonitor(a.conn.bind(ctx)).Cont(); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	a.paused.Store(nil)
	a.cfg.Audit(AuditEvent{Kind: "resume", Actor: actor, Scope: "vm", Begun: p.since, Duration: a.now().Sub(p.since)})
	return nil
}

// AdoptPause records that the VM is already paused (a previous adapter's
// Pause, as its audit log shows) without sending anything: agent input is
// fenced and Resume sends cont. It fails with ErrPaused if this adapter
// already knows of a pause.
func (a *Adapter) AdoptPause(actor string, since time.Time) error {
	if err := checkActor(actor); err != nil {
		return err
	}
	a.pauseMu.Lock()
	defer a.pauseMu.Unlock()
	if p := a.paused.Load(); p != nil {
		return fmt.Errorf("%w (by %s)", ErrPaused, p.actor)
	}
	a.paused.Store(&pauseState{actor: actor, since: since})
	return nil
}

// Paused reports whether Pause froze the VM, by whom and since when.
func (a *Adapter) Paused() (actor string, since time.Time, ok bool) {
	if p := a.paused.Load(); p != nil {
		return p.actor, p.since, true
	}
	return "", time.Time{}, false
}

func checkActor(actor string) error {
	if actor == "" || len(actor) > 128 || strings.IndexFunc(actor, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("%w: actor must be 1..128 printable characters", ErrConfig)
	}
	return nil
}
