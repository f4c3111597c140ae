//go:build !linux

package jail

import "io"

// Process is one jailed agent; on this system none can be started.
type Process struct {
	Stdin  io.WriteCloser
	Stdout io.ReadCloser
}

// HelperMain does nothing on this system.
func HelperMain() {}

// Check always fails with ErrUnsupported.
func Check(*Spec) error { return ErrUnsupported }

// Start always fails with ErrUnsupported.
func Start(*Spec, io.Writer) (*Process, error) { return nil, ErrUnsupported }

// Pid is 0.
func (p *Process) Pid() int { return 0 }

// Kill fails with ErrUnsupported.
func (p *Process) Kill() error { return ErrUnsupported }

// Terminate fails with ErrUnsupported.
func (p *Process) Terminate() error { return ErrUnsupported }

// Wait fails with ErrUnsupported.
func (p *Process) Wait() error { return ErrUnsupported }

// Banner is empty.
func (s *Spec) Banner() string { return "" }

// LandlockABI is 0.
func LandlockABI() int { return 0 }
