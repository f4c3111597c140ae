package service

import (
	"context"
	"fmt"
	"slices"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// A computer's egress: its policy is part of its record (the zero Policy
// denies all). With Config.Egress set, the service attaches a computer
// to the host's egress proxy when it becomes running (create, a claimed
// pool machine, a re-adopted one) through a listener in the computer's
// own network namespace (a VM computer's: its own wire link), points its grant's environment at it, and
// detaches it before the teardown. Without Config.Egress a computer has
// its loopback only, as before, and a policy that allows anything is
// refused (no_egress).

// checkEgress refuses a policy that is malformed (bad_request), names a
// preset the operator did not configure (unknown_preset), or allows
// something where the service gives no egress (no_egress).
func (s *Service) checkEgress(pol policy.Policy) error {
	if err := pol.Validate(); err != nil {
		return api.Errorf(api.CodeBadRequest, "egress: %v", err)
	}
	for _, name := range pol.Presets {
		if !slices.Contains(s.cfg.EgressPresets, name) {
			return api.Errorf(api.CodeUnknownPreset, "egress: no preset %q in the operator's egress configuration", name)
		}
	}
	if s.cfg.Egress == nil && !denyAll(pol) {
		return api.Errorf(api.CodeNoEgress, "egress: this service gives computers no egress")
	}
	return nil
}

// denyAll says pol allows nothing: no allow rule and no preset.
func denyAll(pol policy.Policy) bool { return len(pol.Allow) == 0 && len(pol.Presets) == 0 }

// attachEgress points c's grant environment at the proxy and attaches c
// to it under its recorded policy; without Config.Egress it does
// nothing. The caller holds c.op, before the Grant that makes c usable.
func (s *Service) attachEgress(ctx context.Context, c *computer) error {
	if s.cfg.Egress == nil {
		return nil
	}
	n, ok := c.m.(api.Networked)
	if !ok {
		return fmt.Errorf("egress: the machine has no network namespace the service can reach")
	}
	if p, ok := c.m.(api.ProxyUser); ok {
		p.UseEgressProxy(true)
	}
	ln, err := n.EgressListener(ctx, api.EgressPort)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	s.mu.Lock()
	id, pol := c.rec.ID, c.rec.Egress
	s.mu.Unlock()
	if err := s.cfg.Egress.Attach(ctx, id, pol, ln, s.refusedFor(id, c.m)); err != nil {
		ln.Close() // Attach may have failed before it took ln
		return fmt.Errorf("egress: attach: %w", err)
	}
	logPath := ""
	if r, ok := c.m.(api.RefusalRecorder); ok {
		logPath = r.RefusalLog()
	}
	s.mu.Lock()
	c.attached, c.refusalLog = true, logPath
	s.mu.Unlock()
	return nil
}

// refusedFor is the refused callback of computer id: the refusal goes to
// the file in the computer (api.RefusalRecorder), a failure to the log
// (the first, then every 1000th, so a flood of refusals to a computer
// whose file cannot be written does not flood the log). The proxy never
// calls it concurrently for one computer.
func (s *Service) refusedFor(id string, m api.Machine) func(policy.Refusal) {
	rec, ok := m.(api.RefusalRecorder)
	failures := 0
	return func(r policy.Refusal) {
		if !ok {
			return
		}
		if err := rec.RecordRefusal(r); err != nil {
			if failures++; failures == 1 || failures%1000 == 0 {
				s.cfg.Logf("computer %s: egress refusal not shown in the computer (%d so far): %v", id, failures, err)
			}
		}
	}
}

// detachEgress detaches c from the proxy (its listener and open
// connections close) before its teardown. A failure is logged: the
// teardown that follows ends the namespace the listener lives in. The
// caller holds c.op.
func (s *Service) detachEgress(c *computer) {
	if s.cfg.Egress == nil {
		return
	}
	s.mu.Lock()
	c.attached, c.refusalLog = false, ""
	s.mu.Unlock()
	if err := s.cfg.Egress.Detach(context.WithoutCancel(s.ctx), c.rec.ID); err != nil {
		s.cfg.Logf("computer %s: egress detach: %v", c.rec.ID, err)
	}
}

// EgressAttached returns the ids of the computers the egress proxy
// serves now, for the metrics.
func (s *Service) EgressAttached() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, c := range s.computers {
		if c.attached {
			ids = append(ids, id)
		}
	}
	return ids
}

// Egress returns the computer's egress policy. It does not wait for an
// operation on the computer (a create, a teardown) to end.
func (s *Service) Egress(ctx context.Context, caller api.Caller, id string) (api.EgressInfo, error) {
	c, err := s.lookup(caller, id)
	if err != nil {
		return api.EgressInfo{}, err
	}
	return s.egressInfo(c), nil
}

// egressInfo is what the API says about c's egress.
func (s *Service) egressInfo(c *computer) api.EgressInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return api.EgressInfo{Computer: c.rec.ID, Policy: c.rec.Egress, Enabled: s.cfg.Egress != nil, Attached: c.attached,
		RefusalLog: c.refusalLog}
}

// SetEgress replaces the egress policy of a running or suspended
// computer: the record first, then the proxy; when the proxy refuses,
// the old record is put back.
func (s *Service) SetEgress(ctx context.Context, caller api.Caller, id string, pol policy.Policy) (api.EgressInfo, error) {
	c, err := s.lookup(caller, id)
	if err != nil {
		return api.EgressInfo{}, err
	}
	if err := s.checkEgress(pol); err != nil {
		return api.EgressInfo{}, err
	}
	if err := tierEgress(c.rec.Tier, pol); err != nil {
		return api.EgressInfo{}, err
	}
	c.op.Lock()
	defer c.op.Unlock()
	if st := s.stateOf(c); st != api.StateRunning && st != api.StateSuspended {
		return api.EgressInfo{}, api.Errorf(api.CodeConflict, "computer %s is %s", id, st)
	}
	old := c.rec.Egress
	if err := s.edit(c, func(r *record) { r.Egress = pol }); err != nil {
		return api.EgressInfo{}, internal("record egress", err)
	}
	if s.cfg.Egress != nil && c.attached {
		if err := s.cfg.Egress.SetPolicy(ctx, id, pol); err != nil {
			s.edit(c, func(r *record) { r.Egress = old })
			return api.EgressInfo{}, internal("egress set policy", err)
		}
	}
	s.cfg.Logf("computer %s: egress policy set by %s: %d allow, %d deny, presets %v", id, callerName(caller),
		len(pol.Allow), len(pol.Deny), pol.Presets)
	return s.egressInfo(c), nil
}
