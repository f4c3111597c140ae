//go:build !linux

package guestrun

import (
	"fmt"
	"os"
)

// Main is the guest's PID 1; it exists only on Linux.
func Main() {
	fmt.Fprintln(os.Stderr, "tether-suiteinit: the suite init runs only as PID 1 of a Linux guest")
	os.Exit(2)
}
