//go:build linux && !amd64

package spawn

// rawClone exists on amd64 alone; cloneSupported refuses ModeClone
// elsewhere, so this is never called.
func rawClone(*clonePlan) uintptr { panic("spawn: ModeClone is amd64 only") }

const cloneArch = false
