package vmsuite

import "github.com/tetherdev/tether/fixtures/guest"

// Accelerator choices (guest.ChooseAccel).
const (
	AccelAuto = guest.AccelAuto // KVM if a probe guest boots under it, else TCG
	AccelTCG  = guest.AccelTCG
	AccelKVM  = guest.AccelKVM // required: fail if the probe does not boot
)
