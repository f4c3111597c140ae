package service

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// Create checks the request, queues it, waits for capacity, and makes
// the computer: queued → creating → (Prepare, or a claimed pool machine)
// → Grant until the lease end → running. A refused request makes
// nothing. Cancelling ctx while queued drops the request; cancelling it
// while the computer is being made deletes the computer once made.
func (s *Service) Create(ctx context.Context, caller api.Caller, req api.CreateRequest) (api.Computer, error) {
	return s.create(ctx, caller, req, creation{})
}

// seedFunc fills a new machine's root before its grant is published.
type seedFunc func(ctx context.Context, m api.Machine) error

// creation says what a create does beyond Create: seed, if set, fills
// the machine's root before its grant; prepare, if set, makes the
// machine instead of its tier's Prepare (an import of a VM disk).
type creation struct {
	seed    seedFunc
	prepare func(ctx context.Context, dir string, l api.Limits) (api.Machine, error)
}

// create is Create with seed (nil: none) run on the machine before its
// grant.
func (s *Service) create(ctx context.Context, caller api.Caller, req api.CreateRequest, how creation) (api.Computer, error) {
	sp, err := s.check(req)
	if err != nil {
		return api.Computer{}, err
	}
	c, w, err := s.enqueue(caller, sp)
	if err != nil {
		return api.Computer{}, err
	}
	if err := s.wait(ctx, c, w, sp.queueTimeout); err != nil {
		return api.Computer{}, err
	}
	return s.make(ctx, c, w, sp, how)
}

// enqueue counts the request against its owner's quota, records it as
// queued, and puts it in the queue.
func (s *Service) enqueue(caller api.Caller, sp spec) (*computer, *waiter, error) {
	now := time.Now()
	c := &computer{rec: record{ID: newID("c-"), Owner: caller.Owner, Limits: sp.limits,
		LeaseTTLSeconds: int64(sp.ttl / time.Second), IdleTimeoutSecs: int64(sp.idle / time.Second),
		Labels: sp.labels, Created: now.UTC().Round(0), Tier: sp.tier, Egress: sp.egress, Screen: sp.screen}, lastActive: now}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, api.Errorf(api.CodeUnavailable, "the service is shutting down")
	}
	if q := s.cfg.OwnerQuota; q > 0 && s.perOwner[caller.Owner] >= q {
		s.mu.Unlock()
		return nil, nil, api.Errorf(api.CodeOverQuota, "owner %q has %d computers, the quota", caller.Owner, q)
	}
	s.perOwner[caller.Owner]++
	c.counted = true
	s.computers[c.rec.ID] = c
	s.mu.Unlock()
	c.op.Lock()
	defer c.op.Unlock()
	if err := s.move(c, api.StateQueued, "create requested", nil); err != nil {
		s.mu.Lock()
		delete(s.computers, c.rec.ID)
		s.uncountLocked(c)
		s.mu.Unlock()
		return nil, nil, internal("record queued", err)
	}
	w := &waiter{c: c, owner: caller.Owner, limits: sp.limits, tier: sp.tier, admitted: make(chan struct{}), cancel: make(chan string, 1),
		left: make(chan struct{})}
	s.mu.Lock()
	c.waiter = w
	s.queue.push(w)
	s.dispatchLocked()
	s.mu.Unlock()
	return c, w, nil
}

// wait returns once w is admitted, or drops it (queued → deleted) when
// the queue timeout passes, ctx ends, or a delete names it.
func (s *Service) wait(ctx context.Context, c *computer, w *waiter, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	var reason string
	var answer error
	select {
	case <-w.admitted:
		return nil
	case <-t.C:
		reason, answer = "queue timeout", api.Errorf(api.CodeQueueTimeout, "waited %s in the queue", timeout)
	case <-ctx.Done():
		reason, answer = "the client went away while queued", fmt.Errorf("create: %w", context.Cause(ctx))
	case why := <-w.cancel:
		reason, answer = why, api.Errorf(api.CodeConflict, "deleted while queued")
	case <-s.ctx.Done():
		reason, answer = "the service closed while queued", api.Errorf(api.CodeUnavailable, "the service is shutting down")
	}
	c.op.Lock()
	defer c.op.Unlock()
	s.mu.Lock()
	s.dropLocked(w)
	s.dispatchLocked()
	s.mu.Unlock()
	s.finish(c, api.StateDeleted, reason)
	close(w.left)
	return answer
}

// make runs the admitted create under c.op.
func (s *Service) make(ctx context.Context, c *computer, w *waiter, sp spec, how creation) (api.Computer, error) {
	c.op.Lock()
	defer c.op.Unlock()
	close(w.left)
	s.mu.Lock()
	c.waiter = nil
	s.mu.Unlock()
	pooled := w.pooled
	dir := filepath.Join(s.cfg.Dir, "computers", c.rec.ID)
	if pooled != nil {
		dir = pooled.Dir()
	}
	deadline := time.Now().Add(sp.ttl)
	err := s.move(c, api.StateCreating, "admitted", func(r *record) {
		r.Dir, r.FromPool, r.LeaseEnd = dir, pooled != nil, deadline.UTC().Round(0)
	})
	if err != nil {
		s.abandonPooled(pooled)
		return api.Computer{}, s.failLocked(c, nil, "record creating: "+err.Error())
	}
	s.armLease(c, deadline)
	s.cfg.step(StepCreateRecorded)
	m, err := s.machine(pooled, c.rec.Tier, dir, sp.limits, sp.screen, how.prepare)
	if err != nil {
		return api.Computer{}, s.failLocked(c, m, err.Error())
	}
	s.cfg.step(StepCreatePrepared)
	c.m = m
	s.refer(c)
	if err := s.attachEgressByTier(s.ctx, c); err != nil {
		return api.Computer{}, s.failLocked(c, m, err.Error())
	}
	if seed := how.seed; seed != nil {
		if err := seed(ctx, m); err != nil {
			return api.Computer{}, seedFailed(err, s.failLocked(c, m, "seed the root: "+err.Error()))
		}
	}
	if err := m.Grant(s.ctx, deadline); err != nil {
		return api.Computer{}, s.failLocked(c, m, "grant: "+err.Error())
	}
	tuple := m.Tuple()
	accel, transport := acceleratorOf(m)
	err = s.move(c, api.StateRunning, "created", func(r *record) {
		r.Tuple, r.CustodianConfig, r.Accelerator, r.Transport = &tuple, m.CustodianConfig(), accel, transport
	})
	if err != nil {
		return api.Computer{}, s.failLocked(c, m, "record running: "+err.Error())
	}
	s.touchLocked(c)
	if ctx.Err() != nil {
		s.endLocked(c, "the client went away during create")
		return api.Computer{}, fmt.Errorf("create: %w", context.Cause(ctx))
	}
	return s.viewOf(c), nil
}

// machine is the claimed pool machine, its pool record dropped (on
// error it is still returned, for the caller to tear down), or a new one
// from prepare when set (an import's), else from Prepare.
func (s *Service) machine(pooled api.Machine, tier, dir string, l api.Limits, screen bool,
	prepare func(context.Context, string, api.Limits) (api.Machine, error)) (api.Machine, error) {
	if pooled != nil {
		if err := s.st.delPool(dir); err != nil {
			return pooled, fmt.Errorf("claim pool machine: %w", err)
		}
		s.kickRefill()
		return pooled, nil
	}
	var m api.Machine
	var err error
	if prepare != nil {
		m, err = prepare(s.ctx, dir, l)
	} else {
		m, err = s.prepare(tier, dir, l, screen)
	}
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	return m, nil
}

// abandonPooled closes a claimed pool machine that never became a
// computer (it is never handed out again).
func (s *Service) abandonPooled(m api.Machine) {
	if m != nil {
		s.closePooled(m)
	}
}

// failLocked ends a computer whose create failed: what was made is torn
// down in the expiry order (or destroyed, when no machine came back),
// then the record says failed. The caller holds c.op.
func (s *Service) failLocked(c *computer, m api.Machine, why string) error {
	s.stopLease(c)
	final := api.StateFailed
	if s.stateOf(c) == api.StateQueued {
		final = api.StateDeleted // nothing was made
	}
	s.detachEgress(c)
	if err := s.teardown(s.provFor(c.rec.Tier), m, c.rec.Dir, s.recordsDir(c.rec.ID)); err != nil {
		why += "; teardown: " + err.Error()
	}
	s.finish(c, final, why)
	return api.Errorf(api.CodeInternal, "create failed: %s", why)
}

// finish records a final state and gives back what c held. The caller
// holds c.op.
func (s *Service) finish(c *computer, final, why string) {
	if err := s.move(c, final, why, nil); err != nil {
		why = fmt.Sprintf("%s (not recorded: %v)", why, err)
		s.mu.Lock()
		c.rec.State, c.rec.Reason = final, why
		s.mu.Unlock()
	}
	s.mu.Lock()
	if c.held {
		s.releaseLocked(c.rec.Limits)
		c.held = false
	}
	s.uncountLocked(c)
	s.dispatchLocked()
	s.mu.Unlock()
	s.kickRefill()
}

func (s *Service) uncountLocked(c *computer) {
	if c.counted {
		s.perOwner[c.rec.Owner]--
		c.counted = false
	}
}
