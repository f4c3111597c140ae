package provision

import (
	"os"
	"testing"

	"github.com/tetherdev/tether/fixtures/bins"
)

// TestMain removes the binaries the tests built; run with
// holdNamespaceEnv set, the test binary is a mount namespace holder.
func TestMain(m *testing.M) {
	if os.Getenv(holdNamespaceEnv) != "" {
		holdNamespaceMain()
	}
	bins.TestMain(m)
}
