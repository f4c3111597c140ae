package main

import (
	"log/slog"

	"github.com/tetherdev/tether/custodian/audit"
)

// witnessOptions returns the submitter options of the config's
// witnesses, or nil. Their log goes to stderr at Info, so each
// checkpoint's outcome (witnessed, or quorum not reached) is on record
// next to the custodian's warnings.
func (r *runner) witnessOptions() (*audit.SubmitOptions, error) {
	o, err := r.cfg.WitnessOptions()
	if o != nil {
		o.Logger = slog.New(slog.NewTextHandler(r.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return o, err
}
