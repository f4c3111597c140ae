package durable

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tetherdev/tether/admission/atomicfile"
)

func TestMkdirAllSyncsTheParentOfEveryNewDirectory(t *testing.T) {
	s, restore := CountSyncs()
	t.Cleanup(restore)
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b", "c")
	if err := MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(root, "a", "b"), filepath.Join(root, "a"), root}
	if got := s.Dirs(); !slices.Equal(got, want) {
		t.Fatalf("synced %q, want %q", got, want)
	}
	if err := MkdirAll(dir, 0o700); err != nil || len(s.Dirs()) != len(want) {
		t.Fatalf("existing directory: err %v, synced %q; want nothing more", err, s.Dirs())
	}
}

func TestSyncDirFailureIsReported(t *testing.T) {
	orig := atomicfile.DirSync
	atomicfile.DirSync = func(*os.File) error { return errors.New("EIO") }
	t.Cleanup(func() { atomicfile.DirSync = orig })
	if err := MkdirAll(filepath.Join(t.TempDir(), "x"), 0o700); err == nil {
		t.Fatal("a failed directory fsync was not reported")
	}
}

func TestCreatedFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if c, err := CreatedFile(p); !c || err != nil {
		t.Fatalf("missing file: %v %v", c, err)
	}
	os.WriteFile(p, nil, 0o600)
	if c, err := CreatedFile(p); c || err != nil {
		t.Fatalf("existing file: %v %v", c, err)
	}
}
