package custodian

import (
	"path/filepath"
	"testing"

	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/durable"
)

// TestNewSyncsTheStateDirectory checks that a new state directory and the
// opkeys/ and audit/ directories in it survive a crash: their parents are
// fsynced.
func TestNewSyncsTheStateDirectory(t *testing.T) {
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	state := filepath.Join(root, "a", "state")
	syncs, restore := durable.CountSyncs()
	t.Cleanup(restore)
	c, err := New(Options{StateDir: state, AuditKey: []byte(skey)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{root, filepath.Join(root, "a"), state} {
		if !syncs.Has(d) {
			t.Errorf("%s not fsynced after creating a directory in it (synced %q)", d, syncs.Dirs())
		}
	}
}
