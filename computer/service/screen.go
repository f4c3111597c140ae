package service

import (
	"context"
	"errors"

	"github.com/tetherdev/tether/computer/api"
)

// tierScreen refuses a screen for a tier whose provisioner cannot give
// one (every tier but the VM tier, and a VM provisioner that is not an
// api.ScreenProvisioner), before anything is made.
func (s *Service) tierScreen(tier string, screen bool) error {
	if !screen {
		return nil
	}
	if tierName(tier) != api.TierVM {
		return api.Errorf(api.CodeBadRequest, "screen: only a %s computer has one, not tier %q", api.TierVM, tierName(tier))
	}
	if _, ok := s.provFor(tier).(api.ScreenProvisioner); !ok {
		return api.Errorf(api.CodeBadRequest, "screen: this service's %s provisioner gives no screen", tier)
	}
	return nil
}

// prepare makes a new machine of tier in dir, with a screen when asked
// (tierScreen checked that the provisioner gives one).
func (s *Service) prepare(tier, dir string, l api.Limits, screen bool) (api.Machine, error) {
	p := s.provFor(tier)
	if sp, ok := p.(api.ScreenProvisioner); ok && screen {
		return sp.PrepareScreen(s.ctx, dir, l)
	}
	return p.Prepare(s.ctx, dir, l)
}

// Link mints a one-time link to the live view of a running computer
// with a screen, for its owner or an admin (lookup answers not_found to
// anyone else). The label, shown on the page and in the view's audit
// log, names who asked.
func (s *Service) Link(ctx context.Context, caller api.Caller, id string, req api.LinkRequest) (api.Link, error) {
	ttl, err := api.CheckLink(req)
	if err != nil {
		return api.Link{}, err
	}
	c, err := s.lookup(caller, id)
	if err != nil {
		return api.Link{}, err
	}
	c.op.Lock()
	defer c.op.Unlock()
	s.mu.Lock()
	screen, state, m := c.rec.Screen, c.rec.State, c.m
	s.mu.Unlock()
	if !screen {
		return api.Link{}, api.Errorf(api.CodeConflict, "computer %s has no screen (create it with screen: true)", id)
	}
	if state != api.StateRunning {
		return api.Link{}, api.Errorf(api.CodeConflict, "computer %s is %s, not running", id, state)
	}
	sm, ok := m.(api.Screen)
	if !ok {
		return api.Link{}, internal("link", errors.New("the machine serves no screen"))
	}
	l, err := sm.MintLink(ctx, req.Role, ttl, req.Role+" link for "+callerName(caller))
	if err != nil {
		return api.Link{}, internal("link", err)
	}
	return l, nil
}
