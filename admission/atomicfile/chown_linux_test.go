package atomicfile

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestChownKeepsTheMode: the owner is set before the mode, so a chown
// (which clears set-id bits, for root too) cannot undo it; with chmod
// before chown the setgid bit is gone. Needs root (the gate).
func TestChownKeepsTheMode(t *testing.T) {
	testenv.Require(t, "root")
	path := filepath.Join(t.TempDir(), "f")
	if err := Write(path, []byte("x"), 0o750|fs.ModeSetgid, Options{Chown: true, UID: 1, GID: 1}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode()&(fs.ModePerm|fs.ModeSetgid) != 0o750|fs.ModeSetgid || st.Uid != 1 || st.Gid != 1 {
		t.Fatalf("mode %v owner %d:%d, want setgid 0750 1:1", fi.Mode(), st.Uid, st.Gid)
	}
}
