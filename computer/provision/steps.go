package provision

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Step is one named step of making a computer ("pki.Certificates").
type Step struct {
	Name string
	Run  func(context.Context) error
}

// RunSteps runs steps in order and stops at the first that fails. Then
// it calls undo to remove what the earlier steps made, with a context
// that outlives ctx's cancellation but ends after grace, and returns the
// failure named by kind and step ("computer: pki.Certificates: ...")
// joined with undo's error. Local's and fixtures/vmcomputer's New run
// their steps with it.
func RunSteps(ctx context.Context, kind string, steps []Step, undo func(context.Context) error, grace time.Duration) error {
	for _, s := range steps {
		if err := s.Run(ctx); err != nil {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
			defer cancel()
			return errors.Join(fmt.Errorf("%s: %s: %w", kind, s.Name, err), undo(uctx))
		}
	}
	return nil
}
