package audit

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetherdev/tether/custodian/internal/durable"
)

// TestOpenSyncsNewDirectoriesAndLog checks that a new audit log survives a
// crash: the parents of the directories Open creates are fsynced, and the
// audit directory is fsynced once the log file exists and before its
// checkpoint is written. Reopening syncs no parent again.
func TestOpenSyncsNewDirectoriesAndLog(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	root := t.TempDir()
	dir := filepath.Join(root, "state", "audit")
	syncs, restore := durable.CountSyncs()
	t.Cleanup(restore)
	logSynced := false
	syncs.Before = func(d string) {
		_, errLog := os.Stat(filepath.Join(dir, LogFile))
		_, errCk := os.Stat(filepath.Join(dir, CheckpointFile))
		if d == dir && errLog == nil && errors.Is(errCk, os.ErrNotExist) {
			logSynced = true
		}
	}
	l := openLog(t, dir, k)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{root, filepath.Join(root, "state")} {
		if !syncs.Has(d) {
			t.Errorf("%s not fsynced after creating its sub-directory (synced %q)", d, syncs.Dirs())
		}
	}
	if !logSynced {
		t.Errorf("the audit directory was not fsynced between creating the log and its checkpoint (synced %q)", syncs.Dirs())
	}
	n := len(syncs.Dirs())
	l = openLog(t, dir, k)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range syncs.Dirs()[n:] {
		if d != dir {
			t.Errorf("reopening synced %s", d)
		}
	}
}
