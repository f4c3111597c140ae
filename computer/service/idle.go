package service

import (
	"context"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// Activity: a computer is active while a command runs as its uid
// (Machine.Busy, read every IdleCheck), each time Touch is called for
// it (the custodian side calls Touch on each callback), and while a
// person holds its screen's input (api.Attended, read every IdleCheck:
// a take-over in progress is activity for as long as it lasts, and its
// end is the last activity; a watcher is not). With no activity for its
// idle timeout a running computer is suspended (Machine.Freeze: memory
// kept, no CPU). Its lease keeps running (see the package doc).

// Suspend freezes a running computer.
func (s *Service) Suspend(ctx context.Context, caller api.Caller, id string) (api.Computer, error) {
	c, err := s.lookup(caller, id)
	if err != nil {
		return api.Computer{}, err
	}
	c.op.Lock()
	defer c.op.Unlock()
	if err := s.suspendLocked(ctx, c, "suspended by "+callerName(caller)); err != nil {
		return api.Computer{}, err
	}
	return s.viewOf(c), nil
}

// suspendLocked records suspended, then freezes; a failed freeze records
// running again. The caller holds c.op.
func (s *Service) suspendLocked(ctx context.Context, c *computer, reason string) error {
	if st := s.stateOf(c); st != api.StateRunning {
		return api.Errorf(api.CodeConflict, "computer %s is %s, not running", c.rec.ID, st)
	}
	if err := s.move(c, api.StateSuspended, reason, nil); err != nil {
		return internal("record suspended", err)
	}
	s.cfg.step(StepSuspendRecorded)
	if err := c.m.Freeze(ctx); err != nil {
		s.move(c, api.StateRunning, "freeze failed: "+err.Error(), nil)
		return internal("freeze", err)
	}
	return nil
}

// Resume thaws a suspended computer.
func (s *Service) Resume(ctx context.Context, caller api.Caller, id string) (api.Computer, error) {
	c, err := s.lookup(caller, id)
	if err != nil {
		return api.Computer{}, err
	}
	c.op.Lock()
	defer c.op.Unlock()
	if err := s.resumeLocked(ctx, c, "resumed by "+callerName(caller)); err != nil {
		return api.Computer{}, err
	}
	return s.viewOf(c), nil
}

// resumeLocked records running, then thaws; a failed thaw records
// suspended again. The caller holds c.op.
func (s *Service) resumeLocked(ctx context.Context, c *computer, reason string) error {
	if st := s.stateOf(c); st != api.StateSuspended {
		return api.Errorf(api.CodeConflict, "computer %s is %s, not suspended", c.rec.ID, st)
	}
	if err := s.move(c, api.StateRunning, reason, nil); err != nil {
		return internal("record running", err)
	}
	if err := c.m.Thaw(ctx); err != nil {
		s.move(c, api.StateSuspended, "thaw failed: "+err.Error(), nil)
		return internal("thaw", err)
	}
	s.touchLocked(c)
	return nil
}

// Touch records activity on computer id, and resumes it first if it is
// suspended, so the callback that touched it finds it running. It is for
// the service's own side (the custodian's callbacks), so it takes no
// caller.
func (s *Service) Touch(ctx context.Context, id string) error {
	s.mu.Lock()
	c, ok := s.computers[id]
	s.mu.Unlock()
	if !ok {
		return api.Errorf(api.CodeNotFound, "no computer %q", id)
	}
	c.op.Lock()
	defer c.op.Unlock()
	switch s.stateOf(c) {
	case api.StateSuspended:
		return s.resumeLocked(ctx, c, "activity")
	case api.StateRunning:
		s.touchLocked(c)
		return nil
	}
	return api.Errorf(api.CodeConflict, "computer %s is %s", id, s.stateOf(c))
}

func (s *Service) touchLocked(c *computer) {
	s.mu.Lock()
	c.lastActive = time.Now()
	s.mu.Unlock()
}

// idleLoop reads every running computer's receiver and activity each
// IdleCheck.
func (s *Service) idleLoop() {
	t := time.NewTicker(s.cfg.IdleCheck)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		for _, c := range s.made() {
			s.checkIdle(c)
		}
	}
}

// made returns the running and suspended computers.
func (s *Service) made() []*computer {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*computer
	for _, c := range s.computers {
		if c.rec.State == api.StateRunning || c.rec.State == api.StateSuspended {
			out = append(out, c)
		}
	}
	return out
}

// checkIdle ends a running or suspended computer whose receiver died
// (failed), and suspends a running one idle for its timeout. It skips a computer whose op is busy (a
// transition is under way; it is read again next time).
func (s *Service) checkIdle(c *computer) {
	if !c.op.TryLock() {
		return
	}
	defer c.op.Unlock()
	st := s.stateOf(c)
	if (st != api.StateRunning && st != api.StateSuspended) || c.m == nil {
		return
	}
	if !c.m.ReceiverAlive() {
		s.endAsLocked(c, "receiver died", api.StateFailed)
		return
	}
	if st == api.StateSuspended {
		return
	}
	if busy, err := c.m.Busy(s.ctx); err == nil && busy {
		s.touchLocked(c)
		return
	}
	attended := attendedAt(c.m)
	s.mu.Lock()
	if attended.After(c.lastActive) {
		c.lastActive = attended
	}
	idle := time.Since(c.lastActive) >= time.Duration(c.rec.IdleTimeoutSecs)*time.Second
	s.mu.Unlock()
	if idle {
		s.suspendLocked(s.ctx, c, "idle")
	}
}

// attendedAt is when a person last held m's input (api.Attended); the
// zero time for a machine nobody can take over.
func attendedAt(m api.Machine) time.Time {
	if a, ok := m.(api.Attended); ok {
		return a.AttendedAt()
	}
	return time.Time{}
}
