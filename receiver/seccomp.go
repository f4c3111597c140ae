package receiver

import (
	"fmt"

	"github.com/tetherdev/tether/receiver/spawn"
)

// Seccomp modes of SeccompConfig.
const (
	// SeccompOff starts children without a seccomp filter.
	SeccompOff = "off"
	// SeccompRequired runs every child under spawn's filter (Docker's
	// default profile, tightened: SECURITY.md "Seccomp filter") and
	// refuses to start when the kernel cannot enforce it: no downgrade.
	SeccompRequired = "required"
)

// SeccompConfig says whether children run under the seccomp filter.
type SeccompConfig struct {
	// Mode is SeccompOff or SeccompRequired; "" means off.
	Mode string `json:"mode"`
}

func (c SeccompConfig) validate() error {
	switch c.Mode {
	case "", SeccompOff, SeccompRequired:
		return nil
	}
	return fmt.Errorf("mode must be %q or %q, not %q", SeccompOff, SeccompRequired, c.Mode)
}

// newSeccompFilter compiles the filter when c requires one (nil when
// off). With a cgroup v2 the filter needs spawn.ModeClone or
// spawn.ModeHelper: a filtered spawning thread could not fork into the
// cgroup (clone3).
func newSeccompFilter(c SeccompConfig, mode spawn.Mode, cg CgroupConfig) (*spawn.Filter, error) {
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%w: seccomp: %w", ErrOptions, err)
	}
	if c.Mode != SeccompRequired {
		return nil, nil
	}
	if mode == spawn.ModeThread && cg.Mode == CgroupRequired {
		return nil, fmt.Errorf("%w: seccomp: %w (spawn \"helper\")", ErrOptions, spawn.ErrSeccompThreadCgroup)
	}
	if err := spawn.SeccompSupported(); err != nil {
		return nil, err
	}
	return spawn.NewFilter()
}
