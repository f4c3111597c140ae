package vm

import (
	"testing"

	"github.com/tetherdev/tether/fixtures/bins"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) { bins.TestMain(m) }
