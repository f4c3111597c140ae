//go:build vmsuite

package nativesuite

import (
	"os"
	"testing"

	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/vmcomputer"
)

func TestMain(m *testing.M) {
	code := m.Run()
	vmcomputer.Cleanup()
	bins.Cleanup()
	os.Exit(code)
}
