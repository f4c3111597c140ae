//go:build vmsuite

package nativesuite

import (
	"testing"

	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/vmcomputer"
)

// TestMain removes the binaries and the guest agent the tests built.
func TestMain(m *testing.M) { bins.TestMain(m, vmcomputer.Cleanup) }
