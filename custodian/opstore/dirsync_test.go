package opstore

import (
	"path/filepath"
	"testing"

	"github.com/tetherdev/tether/custodian/internal/durable"
)

// TestOpenSyncsNewDirectories checks that a new op-key directory survives
// a crash: the parents of every directory Open creates are fsynced, and
// the store's own directory once its files exist.
func TestOpenSyncsNewDirectories(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "state", "opkeys")
	syncs, restore := durable.CountSyncs()
	t.Cleanup(restore)
	openT(t, dir, Options{})
	for _, d := range []string{root, filepath.Join(root, "state"), dir} {
		if !syncs.Has(d) {
			t.Errorf("%s not fsynced after creating an entry in it (synced %q)", d, syncs.Dirs())
		}
	}
}
