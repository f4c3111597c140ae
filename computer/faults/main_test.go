// Package faults holds the computer service's fault tests: the real
// `tether-computer serve` binary over the real provisioner, SIGKILLed in
// the middle of its operations, churned by clients that vanish, and
// asked to freeze a computer that spins. Every check of what is left is
// read from the host (processes, cgroups, loop devices, mounts, System V
// IPC), never from the daemon's own counters. It holds tests only.
package faults

import (
	"testing"

	"github.com/tetherdev/tether/fixtures/bins"
)

func TestMain(m *testing.M) { bins.TestMain(m) }
