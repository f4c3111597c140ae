package provision

import (
	"context"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/coordinator"
	"github.com/tetherdev/tether/admission/signedfile"
)

// Publish implements fixtures/computer.Computer: it signs and atomically
// publishes a snapshot holding exactly grants. With notAfter zero the snapshot ends
// with its latest grant (or Options.Lease from now when there is none).
func (c *Local) Publish(ctx context.Context, notAfter time.Time, grants ...admission.Grant) (signedfile.Published, error) {
	return c.grants.Publish(ctx, notAfter, grants...)
}

// Coordinate implements fixtures/computer.Computer with the real
// coordinator: it writes the current grant with not_after = requested as
// the coordinator's input, and runs one round (renew with r, then publish
// capped at the lease).
func (c *Local) Coordinate(ctx context.Context, r coordinator.Renewer, requested time.Time) (coordinator.Round, error) {
	return c.grants.Coordinate(ctx, r, requested)
}
