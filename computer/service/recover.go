package service

import (
	"context"
	"fmt"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/lifecycle"
)

// recover runs once in Open, before any request: it brings the log level
// with the store, destroys the pool machines a previous daemon left, and
// decides each computer record's fate:
//
//   - queued: the client is gone with the old daemon → deleted.
//   - creating, expiring (left mid-way): adopted machines are torn down
//     in the expiry order, others destroyed → failed (creating) or
//     deleted (expiring).
//   - running, suspended: Adopt; if the receiver died → expiring →
//     Destroy → failed ("receiver died"). Adopted ones are made to match
//     the record (Thaw a running one, Freeze a suspended one: a crash
//     may have come between the record and the freezer), their capacity
//     held, and their lease timer re-armed from the recorded end.
//   - deleted, failed: kept for Get and List.
func (s *Service) recover(ctx context.Context) error {
	recs, err := s.st.all()
	if err != nil {
		return err
	}
	if err := s.destroyPoolLeftovers(ctx); err != nil {
		return err
	}
	for _, r := range recs {
		c := &computer{rec: r, lastActive: time.Now()}
		s.computers[r.ID] = c
		if err := s.catchUpLog(c); err != nil {
			return err
		}
		if err := s.recoverOne(ctx, c); err != nil {
			return fmt.Errorf("computer %s: %w", r.ID, err)
		}
	}
	return nil
}

// catchUpLog appends the one transition the store may hold that the log
// does not (a crash between the store's write and the log's).
func (s *Service) catchUpLog(c *computer) error {
	last := s.log.Last(c.rec.ID)
	if last == c.rec.State {
		return nil
	}
	lr, err := s.log.Append(lifecycle.Record{Computer: c.rec.ID, Owner: c.rec.Owner, From: last, To: c.rec.State,
		At: time.Now(), Reason: "logged at restart: " + c.rec.Reason})
	if err != nil {
		return fmt.Errorf("store says %s %s, log says %q: %w", c.rec.ID, c.rec.State, last, err)
	}
	s.ev.publish(api.Event{Seq: lr.Seq, Computer: c.rec.ID, Owner: c.rec.Owner, From: last, To: c.rec.State, At: lr.At,
		Reason: lr.Reason})
	return nil
}

func (s *Service) recoverOne(ctx context.Context, c *computer) error {
	c.op.Lock()
	defer c.op.Unlock()
	switch c.rec.State {
	case api.StateQueued:
		return s.move(c, api.StateDeleted, "the daemon restarted while queued", nil)
	case api.StateCreating:
		return s.finishLeftover(ctx, c, nil, true, api.StateExpiring, api.StateFailed,
			"the daemon restarted during create")
	case api.StateExpiring:
		return s.finishLeftover(ctx, c, nil, true, "", api.StateDeleted, c.rec.Reason)
	case api.StateRunning, api.StateSuspended:
		return s.readopt(ctx, c)
	}
	return nil
}

// finishLeftover tears down what a create or an expiry left: m, or the
// machine in the record's directory if adopt and it can be adopted, in
// the expiry order; else it destroys the directory.
func (s *Service) finishLeftover(ctx context.Context, c *computer, m api.Machine, adopt bool,
	via, final, reason string) error {
	if via != "" {
		if err := s.move(c, via, reason, nil); err != nil {
			return err
		}
	}
	if m == nil && adopt && c.rec.Dir != "" {
		if am, err := s.provFor(c.rec.Tier).Adopt(ctx, c.rec.Dir); err == nil {
			m = am
		}
	}
	s.detachEgress(c)
	if err := s.teardown(s.provFor(c.rec.Tier), m, c.rec.Dir, s.recordsDir(c.rec.ID)); err != nil {
		final, reason = api.StateFailed, reason+"; teardown: "+err.Error()
	}
	return s.move(c, final, reason, nil)
}

// readopt takes back a running or suspended computer, or ends it when
// its receiver died.
func (s *Service) readopt(ctx context.Context, c *computer) error {
	m, err := s.provFor(c.rec.Tier).Adopt(ctx, c.rec.Dir)
	if err != nil {
		return s.finishLeftover(ctx, c, nil, false, api.StateExpiring, api.StateFailed,
			"receiver died: "+err.Error())
	}
	c.m = m
	s.refer(c)
	if c.rec.State == api.StateRunning {
		err = m.Thaw(ctx)
	} else {
		err = m.Freeze(ctx)
	}
	if err != nil {
		return s.finishLeftover(ctx, c, m, false, api.StateExpiring, api.StateFailed,
			"re-adopted but its freezer state could not be restored: "+err.Error())
	}
	// Without the proxy the computer keeps its loopback only: it fails
	// closed, and its owner sees attached false.
	if err := s.attachEgress(ctx, c); err != nil {
		s.cfg.Logf("computer %s: re-adopted without egress: %v", c.rec.ID, err)
	}
	s.mu.Lock()
	s.holdLocked(c.rec.Limits)
	c.held, c.counted = true, true
	s.perOwner[c.rec.Owner]++
	s.mu.Unlock()
	// The recorded end is wall clock; from here on the timer runs on the
	// monotonic clock.
	s.armLease(c, time.Now().Add(time.Until(c.rec.LeaseEnd)))
	return nil
}

func (s *Service) destroyPoolLeftovers(ctx context.Context) error {
	dirs, err := s.st.poolDirs()
	if err != nil {
		return fmt.Errorf("pool records: %w", err)
	}
	for _, d := range dirs {
		if err := s.prov.Destroy(ctx, d); err != nil {
			return fmt.Errorf("destroy pool machine %s: %w", d, err)
		}
		if err := s.st.delPool(d); err != nil {
			return err
		}
	}
	return nil
}
