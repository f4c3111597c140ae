package view

import (
	"context"
	"fmt"
)

// Pause freezes the VM (qmpinput.Adapter.Pause) on behalf of the VM's
// owner (Config.PauseOwner, which actor names, e.g. "tether-computer
// (suspend)"), records it in the audit log and tells every viewer: the
// page shows the VM paused and no viewer's input passes until Resume.
// It fails if the pause could not be recorded (the VM then stays
// paused: the owner's stop stands, and the failure is returned).
func (s *Server) Pause(ctx context.Context, actor string) error {
	s.ar.aud.bind(actor, "owner", "")
	s.ar.staleAuditErr()
	err := s.ar.adapter.Pause(ctx, actor)
	if err == nil {
		if aerr := s.ar.aud.takeErr(); aerr != nil {
			err = fmt.Errorf("%w: %w", ErrAudit, aerr)
		}
	}
	s.ar.changed()
	return err
}

// Resume unfreezes the VM the owner paused (qmpinput.Adapter.Resume)
// and tells every viewer.
func (s *Server) Resume(ctx context.Context, actor string) error {
	s.ar.aud.bind(actor, "owner", "")
	err := s.ar.adapter.Resume(ctx, actor)
	s.ar.staleAuditErr()
	s.ar.changed()
	return err
}
