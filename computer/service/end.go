package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// Delete ends a computer: a queued one leaves the queue; a made one goes
// expiring, then its grant is withdrawn, its commands killed and it is
// torn down, in that order. Deleting a deleted or failed computer does
// nothing.
func (s *Service) Delete(ctx context.Context, caller api.Caller, id string) error {
	c, err := s.lookup(caller, id)
	if err != nil {
		return err
	}
	c.op.Lock()
	s.mu.Lock()
	w := c.waiter
	s.mu.Unlock()
	if w != nil {
		// The create's own goroutine records the drop, or, admitted
		// meanwhile, holds c.op while it makes the computer.
		c.op.Unlock()
		select {
		case w.cancel <- "deleted by " + callerName(caller) + " while queued":
		default:
		}
		select {
		case <-w.left:
		case <-ctx.Done():
			return fmt.Errorf("delete: %w", context.Cause(ctx))
		}
		c.op.Lock()
	}
	defer c.op.Unlock()
	return s.endLocked(c, "deleted by "+callerName(caller))
}

func callerName(c api.Caller) string {
	if c.Admin {
		return "admin " + c.Owner
	}
	return "owner " + c.Owner
}

// endLocked runs the expiry order on a made computer: record expiring,
// withdraw the grant, kill the commands, tear down, record deleted (or
// failed, naming the step that failed). The caller holds c.op.
func (s *Service) endLocked(c *computer, reason string) error {
	return s.endAsLocked(c, reason, api.StateDeleted)
}

// endAsLocked is endLocked with the final state of a teardown that
// succeeded: deleted, or failed for a computer that broke (its receiver
// died).
func (s *Service) endAsLocked(c *computer, reason, final string) error {
	switch st := s.stateOf(c); st {
	case api.StateDeleted, api.StateFailed:
		return nil
	case api.StateRunning, api.StateSuspended, api.StateCreating:
	default:
		return api.Errorf(api.CodeConflict, "computer %s is %s", c.rec.ID, st)
	}
	s.stopLease(c)
	if err := s.move(c, api.StateExpiring, reason, nil); err != nil {
		return internal("record expiring", err)
	}
	s.cfg.step(StepEndRecorded)
	s.detachEgress(c)
	why := reason
	if err := s.teardown(s.provFor(c.rec.Tier), c.m, c.rec.Dir, s.recordsDir(c.rec.ID)); err != nil {
		final, why = api.StateFailed, reason+"; teardown: "+err.Error()
	}
	s.finish(c, final, why)
	if final == api.StateFailed {
		return api.Errorf(api.CodeInternal, "%s", why)
	}
	return nil
}

// teardown ends a machine in the expiry order: Withdraw (the receiver
// refuses from now on), KillCommands, the custody records kept into
// records (when the machine is an api.RecordKeeper and records is not
// empty), Close. Every step runs even when one before it failed; a
// failed Close falls back to Destroy. With no machine (it never came
// back from Prepare, or could not be adopted) it destroys dir. p is the
// provisioner of the machine's tier.
func (s *Service) teardown(p api.Provisioner, m api.Machine, dir, records string) error {
	ctx := context.WithoutCancel(s.ctx)
	if m == nil {
		if dir == "" {
			return nil
		}
		if err := p.Destroy(ctx, dir); err != nil {
			return fmt.Errorf("destroy: %w", err)
		}
		return nil
	}
	var errs []error
	if err := m.Withdraw(ctx); err != nil {
		errs = append(errs, fmt.Errorf("withdraw: %w", err))
	}
	s.cfg.step(StepEndWithdrawn)
	if err := m.KillCommands(ctx); err != nil {
		errs = append(errs, fmt.Errorf("kill commands: %w", err))
	}
	if k, ok := m.(api.RecordKeeper); ok && records != "" {
		if err := k.KeepRecords(ctx, records); err != nil {
			errs = append(errs, fmt.Errorf("keep records: %w", err))
		}
	}
	s.cfg.step(StepEndKilled)
	if err := m.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("close: %w", err))
		if err := p.Destroy(ctx, m.Dir()); err != nil {
			errs = append(errs, fmt.Errorf("destroy: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Renew sets the lease to ttl from now (at most the maximum): the record
// first, then a new grant until the new end; a failed grant puts the old
// end back.
func (s *Service) Renew(ctx context.Context, caller api.Caller, id string, ttl time.Duration) (api.Computer, error) {
	c, err := s.lookup(caller, id)
	if err != nil {
		return api.Computer{}, err
	}
	if ttl <= 0 || ttl%time.Second != 0 {
		return api.Computer{}, api.Errorf(api.CodeBadRequest, "lease_ttl_s must be a positive number of seconds")
	}
	if ttl > s.cfg.MaxLeaseTTL {
		return api.Computer{}, api.Errorf(api.CodeBadRequest, "lease_ttl_s %d is over the maximum %d",
			int64(ttl/time.Second), int64(s.cfg.MaxLeaseTTL/time.Second))
	}
	c.op.Lock()
	defer c.op.Unlock()
	if st := s.stateOf(c); st != api.StateRunning && st != api.StateSuspended {
		return api.Computer{}, api.Errorf(api.CodeConflict, "computer %s is %s", id, st)
	}
	deadline := time.Now().Add(ttl)
	old := c.rec.LeaseEnd
	if err := s.edit(c, func(r *record) { r.LeaseEnd = deadline.UTC().Round(0) }); err != nil {
		return api.Computer{}, internal("record lease", err)
	}
	if err := c.m.Grant(ctx, deadline); err != nil {
		s.edit(c, func(r *record) { r.LeaseEnd = old })
		return api.Computer{}, internal("grant", err)
	}
	s.armLease(c, deadline)
	return s.viewOf(c), nil
}

// armLease (re)starts c's lease timer for deadline, read on the
// monotonic clock.
func (s *Service) armLease(c *computer, deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.deadline = deadline
	if c.timer != nil {
		c.timer.Stop()
	}
	if s.closed {
		return
	}
	c.timer = time.AfterFunc(time.Until(deadline), func() { s.goBackground(func() { s.expire(c) }) })
}

func (s *Service) stopLease(c *computer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// expire ends c when its lease has ended (a renew may have moved it).
func (s *Service) expire(c *computer) {
	c.op.Lock()
	defer c.op.Unlock()
	s.mu.Lock()
	early := time.Now().Before(c.deadline)
	deadline := c.deadline
	s.mu.Unlock()
	if early {
		s.armLease(c, deadline)
		return
	}
	s.endLocked(c, "lease expired")
}
