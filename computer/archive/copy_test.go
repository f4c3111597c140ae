package archive

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
)

func openRoot(t *testing.T, dir string) *os.Root {
	t.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root
}

// TestCopyInFile: a file copied in lands at dst (its missing parents
// made), owned by the given ids with its mode, and the receipt is the
// SHA-256 of its content.
func TestCopyInFile(t *testing.T) {
	testenv.Require(t, "root")
	src := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(src, []byte("project file"), 0o640); err != nil {
		t.Fatal(err)
	}
	computer := t.TempDir()
	rc, err := CopyIn(context.Background(), src, openRoot(t, computer), "/work/deep/in.txt",
		CopyOptions{Owner: Owner{UID: 61234, GID: 61235}})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("project file"))
	if rc.SHA256 != hex.EncodeToString(sum[:]) || rc.Bytes != 12 || rc.Files != 1 {
		t.Errorf("receipt %+v", rc)
	}
	checkEntry(t, computer, "work/deep/in.txt", 0o640)
	checkEntry(t, computer, "work/deep", 0o755)
	if _, err := CopyIn(context.Background(), src, openRoot(t, computer), "work/deep/in.txt", CopyOptions{}); !errors.Is(err, ErrNotEmpty) {
		t.Errorf("copy over an existing file: %v, want ErrNotEmpty", err)
	}
}

// TestCopyFolderInAndOut: a folder copied in and out again keeps its
// files, modes and symlinks (never followed), leaves the fifo out, and
// two copies of the same folder have the same digest.
func TestCopyFolderInAndOut(t *testing.T) {
	src := t.TempDir()
	makeTree(t, src)
	computer := t.TempDir()
	root := openRoot(t, computer)
	in, err := CopyIn(context.Background(), src, root, "project", CopyOptions{Owner: Owner{Keep, Keep}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := CopyIn(context.Background(), src, root, "project2", CopyOptions{Owner: Owner{Keep, Keep}})
	if err != nil {
		t.Fatal(err)
	}
	if in.Files != 9 || in.Skipped != 1 || in.SHA256 != again.SHA256 || in.Bytes != again.Bytes {
		t.Errorf("receipts %+v and %+v", in, again)
	}
	out := filepath.Join(t.TempDir(), "out")
	back, err := CopyOut(context.Background(), root, "/project", out, CopyOptions{Owner: Owner{Keep, Keep}})
	if err != nil {
		t.Fatal(err)
	}
	if back.Files != 9 || back.SHA256 == "" {
		t.Errorf("copy out receipt %+v", back)
	}
	want := []string{"abs", "empty", "private", "suid", "work", "work/link", "work/run.sh", "work/src", "work/src/main.go"}
	if tree := listTree(t, out); !slices.Equal(tree, want) {
		t.Errorf("copied out %q, want %q", tree, want)
	}
	if fi, err := os.Lstat(filepath.Join(out, "suid")); err != nil || fi.Mode() != 0o755 {
		t.Errorf("suid copied out as %v %v, want 0755 without the set-id bit", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(out, "abs")); err != nil || target != "/etc/passwd" {
		t.Errorf("abs copied out as %q %v, want the symlink itself", target, err)
	}
}

// TestCopyInRefusesEscapes: a destination through a symlink of the
// computer that points outside it, or with "..", is refused and nothing
// is written outside; the same copy done naively with joined paths
// writes outside (positive control).
func TestCopyInRefusesEscapes(t *testing.T) {
	scratch, computer := newScratch(t)
	if err := os.Symlink(scratch, filepath.Join(computer, "link")); err != nil {
		t.Fatal(err)
	}
	srcFile := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(srcFile, []byte("pwned"), 0o644); err != nil {
		t.Fatal(err)
	}
	srcDir := t.TempDir()
	makeTree(t, srcDir)
	root := openRoot(t, computer)
	for _, tc := range []struct{ src, dst string }{
		{srcFile, "link/escaped"}, {srcDir, "link/escaped"}, {srcFile, "../escaped"}, {srcDir, "/../escaped"},
	} {
		if _, err := CopyIn(context.Background(), tc.src, root, tc.dst, CopyOptions{Owner: Owner{Keep, Keep}}); !errors.Is(err, ErrUnsafeEntry) {
			t.Errorf("copy %s to %s: %v, want ErrUnsafeEntry", filepath.Base(tc.src), tc.dst, err)
		}
	}
	if got := listTree(t, scratch); !slices.Equal(got, []string{"dest", "dest/link", secret}) {
		t.Errorf("after the refused copies the scratch holds %q", got)
	}
	// Positive control: the naive copy, a path join, lands outside.
	if err := os.WriteFile(filepath.Join(computer, "link/escaped"), []byte("pwned"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(scratch, "escaped")); err != nil {
		t.Errorf("positive control: the naive copy did not land outside: %v", err)
	}
}

// TestCopyOutKeepsSymlinks: a computer's symlink to a host file is copied
// out as the symlink, not the host file's content, and a symlink given as
// the source is refused; reading through it naively gets the secret
// (positive control).
func TestCopyOutKeepsSymlinks(t *testing.T) {
	scratch, computer := newScratch(t)
	if err := os.MkdirAll(filepath.Join(computer, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(scratch, secret), filepath.Join(computer, "dir/s")); err != nil {
		t.Fatal(err)
	}
	root := openRoot(t, computer)
	out := t.TempDir()
	if _, err := CopyOut(context.Background(), root, "dir/s", filepath.Join(out, "file"), CopyOptions{Owner: Owner{Keep, Keep}}); !errors.Is(err, ErrUnsafeEntry) {
		t.Errorf("copy out of a symlink: %v, want ErrUnsafeEntry", err)
	}
	if _, err := CopyOut(context.Background(), root, "dir", filepath.Join(out, "dir"), CopyOptions{Owner: Owner{Keep, Keep}}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(out, "dir/s"))
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("dir/s copied out as %v %v, want a symlink", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(computer, "dir/s")); string(b) != "secret" {
		t.Errorf("positive control: reading through the symlink naively got %q", b)
	}
}

// TestCopyInCaps: a file over MaxBytes and a folder over MaxFiles are
// refused and leave nothing; within the caps they copy.
func TestCopyInCaps(t *testing.T) {
	src := t.TempDir()
	makeTree(t, src)
	computer := t.TempDir()
	root := openRoot(t, computer)
	file := filepath.Join(src, "work/src/main.go")
	if _, err := CopyIn(context.Background(), file, root, "f", CopyOptions{Owner: Owner{Keep, Keep}, Limits: Limits{MaxBytes: 4}}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("file over the cap: %v", err)
	}
	if _, err := CopyIn(context.Background(), src, root, "d", CopyOptions{Owner: Owner{Keep, Keep}, Limits: Limits{MaxFiles: 3}}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("folder over the cap: %v", err)
	}
	if got := listTree(t, computer); len(got) != 0 {
		t.Errorf("refused copies left %q", got)
	}
	if _, err := CopyIn(context.Background(), src, root, "d", CopyOptions{Owner: Owner{Keep, Keep}, Limits: Limits{MaxFiles: 9}}); err != nil {
		t.Errorf("folder at the cap: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(computer, "d"), &st); err != nil || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("Keep: d owned by %d (%v), want %d", st.Uid, err, os.Geteuid())
	}
}
