// Package guestrun is both ends of a suite run inside a test VM: the plan
// the host places in the image, the PID 1 that carries it out in the guest
// (mounts, kernel modules, each test binary in turn, power-off), and the
// framed report the guest streams back over a virtio-serial port, with the
// host's strict decoder for it.
//
// The guest writes its report only to the port, which it holds open for
// the whole run (a virtio-serial port admits one opener at a time) and
// never passes to a child, so nothing a test prints on its own output can
// pose as a frame: test output travels inside frames as data.
package guestrun

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// PlanPath is where the host places the plan in the image.
const PlanPath = "/etc/tether-suite/plan.json"

// ErrPlan wraps every refusal of a plan.
var ErrPlan = errors.New("suite plan")

// Plan is what the guest runs, in order, and where it reports.
type Plan struct {
	// Suite names the suite, for the console log.
	Suite string `json:"suite"`
	// Port is the name of the virtio-serial port the report is written to
	// (/sys/class/virtio-ports/*/name).
	Port string `json:"port"`
	// Env is the whole environment of every step ("NAME=value").
	Env []string `json:"env"`
	// Steps run one after the other.
	Steps []Step `json:"steps"`
}

// Step is one program the guest runs to completion.
type Step struct {
	// Name identifies the step in the report (e.g. a package path).
	Name string `json:"name"`
	// Argv is the program and its arguments; Argv[0] is an absolute path.
	Argv []string `json:"argv"`
	// Dir is the working directory (absolute).
	Dir string `json:"dir"`
	// TimeoutS bounds the step; the guest kills its process group after it.
	TimeoutS int `json:"timeout_s"`
}

// Timeout returns the step's bound as a duration.
func (s Step) Timeout() time.Duration { return time.Duration(s.TimeoutS) * time.Second }

var portName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Validate reports the first invalid field.
func (p Plan) Validate() error {
	if p.Suite == "" {
		return fmt.Errorf("%w: suite is required", ErrPlan)
	}
	if !portName.MatchString(p.Port) {
		return fmt.Errorf("%w: port %q is not a plain port name", ErrPlan, p.Port)
	}
	if len(p.Steps) == 0 {
		return fmt.Errorf("%w: no steps", ErrPlan)
	}
	for i, s := range p.Steps {
		if err := s.validate(); err != nil {
			return fmt.Errorf("%w: steps[%d] %q: %w", ErrPlan, i, s.Name, err)
		}
	}
	return nil
}

func (s Step) validate() error {
	switch {
	case s.Name == "":
		return errors.New("name is required")
	case len(s.Argv) == 0 || !absClean(s.Argv[0]):
		return errors.New("argv[0] must be an absolute clean path")
	case !absClean(s.Dir):
		return errors.New("dir must be an absolute clean path")
	case s.TimeoutS <= 0:
		return errors.New("timeout_s must be positive")
	}
	return nil
}

func absClean(p string) bool { return path.IsAbs(p) && path.Clean(p) == p }

// maxPlanBytes bounds a plan file.
const maxPlanBytes = 1 << 20

// DecodePlan strictly decodes and validates a plan.
func DecodePlan(data []byte) (Plan, error) {
	var p Plan
	if err := strictjson.Decode(data, maxPlanBytes, &p); err != nil {
		return Plan{}, fmt.Errorf("%w: %w", ErrPlan, err)
	}
	return p, p.Validate()
}
