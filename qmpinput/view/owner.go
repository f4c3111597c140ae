package view

import (
	"context"
	"fmt"
	"time"
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

// AttendedAt tells the VM's owner when a person last held its input:
// Config.Now's reading while a take-over is in progress (the person
// typing or not), the moment the last hold ended after that (hand
// back, its TTL, a revoked token, a closed page), and the zero time if
// nobody has taken over. Watching, with a view or a control token, is
// not holding: a viewer that never took over does not move it.
func (s *Server) AttendedAt() time.Time {
	return s.ar.attendedAt()
}
