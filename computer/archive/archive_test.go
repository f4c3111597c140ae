package archive

import (
	"bytes"
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

// makeTree makes a small computer root: nested folders, an empty one,
// modes, a relative and an absolute symlink, a setuid file and a fifo.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"work/src", "empty"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, mode := range map[string]os.FileMode{"work/src/main.go": 0o644, "work/run.sh": 0o755, "private": 0o600} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("content of "+name), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "suid"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "suid"), 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("src/main.go", filepath.Join(dir, "work/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "abs")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestExportImportRoundTrip: an export's receipt is the SHA-256 and
// length of the bytes written, and importing them rebuilds the tree:
// contents, permission bits (set-id bits dropped), symlinks as symlinks,
// every entry owned by the given uid and gid, the fifo left out.
func TestExportImportRoundTrip(t *testing.T) {
	testenv.Require(t, "root")
	src := t.TempDir()
	makeTree(t, src)
	root, err := os.OpenRoot(src)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	var buf bytes.Buffer
	rc, err := Export(context.Background(), root, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(buf.Bytes()); rc.SHA256 != hex.EncodeToString(sum[:]) || rc.Bytes != int64(buf.Len()) {
		t.Errorf("receipt %+v does not describe the %d bytes written", rc, buf.Len())
	}
	if rc.Files != 9 || rc.Skipped != 1 {
		t.Errorf("receipt counts %d entries and %d skipped, want 9 and 1", rc.Files, rc.Skipped)
	}
	dest := t.TempDir()
	got, err := Import(context.Background(), bytes.NewReader(buf.Bytes()), dest,
		ImportOptions{SHA256: rc.SHA256, Owner: Owner{UID: 61234, GID: 61235}})
	if err != nil {
		t.Fatal(err)
	}
	if got.SHA256 != rc.SHA256 || got.Bytes != rc.Bytes || got.Files != rc.Files {
		t.Errorf("import receipt %+v, export receipt %+v", got, rc)
	}
	want := []string{"abs", "empty", "private", "suid", "work", "work/link", "work/run.sh", "work/src", "work/src/main.go"}
	if tree := listTree(t, dest); !slices.Equal(tree, want) {
		t.Fatalf("imported tree %q, want %q", tree, want)
	}
	checkEntry(t, dest, "work/run.sh", 0o755)
	checkEntry(t, dest, "private", 0o600)
	checkEntry(t, dest, "suid", 0o755)
	checkEntry(t, dest, "work/src", 0o755)
	checkEntry(t, dest, "abs", os.ModeSymlink|0o777)
	if b, err := os.ReadFile(filepath.Join(dest, "work/src/main.go")); err != nil || string(b) != "content of work/src/main.go" {
		t.Errorf("main.go: %q %v", b, err)
	}
	if target, err := os.Readlink(filepath.Join(dest, "abs")); err != nil || target != "/etc/passwd" {
		t.Errorf("abs links to %q %v", target, err)
	}
}

// checkEntry checks an imported entry's mode and owner (61234:61235).
func checkEntry(t *testing.T, dir, name string, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != mode && !(fi.IsDir() && fi.Mode() == os.ModeDir|mode) {
		t.Errorf("%s: mode %v, want %v", name, fi.Mode(), mode)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 61234 || st.Gid != 61235 {
		t.Errorf("%s: owned by %d:%d, want 61234:61235", name, st.Uid, st.Gid)
	}
}

// TestExportIsDeterministic: two exports of the same tree are the same
// bytes, and a one-byte change in a file changes the digest.
func TestExportIsDeterministic(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(src)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	export := func() Receipt {
		rc, err := Export(context.Background(), root, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		return rc
	}
	first, second := export(), export()
	if first != second {
		t.Errorf("two exports differ: %+v %+v", first, second)
	}
	fi, _ := os.Stat(filepath.Join(src, "a"))
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("hellO"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(filepath.Join(src, "a"), fi.ModTime(), fi.ModTime())
	if third := export(); third.SHA256 == first.SHA256 {
		t.Error("a changed byte left the digest as it was")
	}
}

// TestExportCancelled: a cancelled context ends the export with its
// error.
func TestExportCancelled(t *testing.T) {
	src := t.TempDir()
	makeTree(t, src)
	root, err := os.OpenRoot(src)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Export(ctx, root, &bytes.Buffer{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled export: %v", err)
	}
}
