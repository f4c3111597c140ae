package fsops

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
)

func sumBytes(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// stageAll writes content through a staged write in chunks of n bytes.
func stageAll(t *testing.T, r *Root, req StageRequest, content []byte, n int) *Staged {
	t.Helper()
	s, err := r.Stage(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for off := 0; off < len(content); off += n {
		if err := s.Append(int64(off), content[off:min(off+n, len(content))]); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestStagedWrite: a staged write in chunks replaces the file atomically
// with the grant's owner and mode; until the commit the old file is
// intact and nothing new is named in the directory; a closed (aborted)
// transfer leaves no trace.
func TestStagedWrite(t *testing.T) {
	testenv.Require(t, "root")
	r, root, _ := tree(t)
	content := make([]byte, 300_000)
	rand.Read(content)
	before := entries(t, filepath.Join(root, "a"))
	write(t, filepath.Join(root, "a", "f"), "old\n")
	s := stageAll(t, r, StageRequest{Path: "a/f", Size: int64(len(content)), SHA256: sumBytes(content), Mode: 0o640,
		ExpectSHA256: sum("old\n")}, content, 65536)
	if got, _ := os.ReadFile(filepath.Join(root, "a", "f")); string(got) != "old\n" {
		t.Fatalf("file changed before commit: %d bytes", len(got))
	}
	if names := entries(t, filepath.Join(root, "a")); len(names) != len(before)+1 {
		t.Fatalf("entries during the transfer: %v (before %v)", names, before)
	}
	res, err := r.Commit(s)
	if err != nil || res.Size != int64(len(content)) || res.SHA256 != sumBytes(content) {
		t.Fatalf("commit = %+v, %v", res, err)
	}
	got, _ := os.ReadFile(filepath.Join(root, "a", "f"))
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "a", "f"), &st); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content) || st.Mode&0o7777 != 0o640 || st.Uid != testUID || st.Gid != testGID {
		t.Fatalf("after commit: %d bytes (equal %v), mode %#o, owner %d:%d", len(got), bytes.Equal(got, content), st.Mode, st.Uid, st.Gid)
	}

	a := stageAll(t, r, StageRequest{Path: "a/g", Size: 10, SHA256: sumBytes(make([]byte, 10))}, make([]byte, 4), 4)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if names := entries(t, filepath.Join(root, "a")); len(names) != len(before)+1 {
		t.Fatalf("entries after an aborted transfer: %v", names)
	}
	if _, err := r.Commit(a); !errors.Is(err, ErrInvalid) {
		t.Fatalf("commit of a closed transfer = %v", err)
	}
}

// TestStagedWriteRefusals: the declared size bounds every chunk and the
// file; chunks go in order; a commit checks the size and digest and,
// under the lock, the preconditions again (a file that changed during
// the transfer is precondition_failed and stays as it is).
func TestStagedWriteRefusals(t *testing.T) {
	testenv.Require(t, "root")
	r, root, _ := tree(t)
	if _, err := r.Stage(StageRequest{Path: "big", Size: testLimits.MaxFileBytes + 1, SHA256: sum("")}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("declared size over the limit = %v", err)
	}
	s, err := r.Stage(StageRequest{Path: "f", Size: 4, SHA256: sum("abcd")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Append(1, []byte("a")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("chunk out of order = %v", err)
	}
	if err := s.Append(0, []byte("abcde")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("chunk past the declared size = %v", err)
	}
	if err := s.Append(0, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Commit(s); !errors.Is(err, ErrDigest) {
		t.Fatalf("commit of 3 of 4 bytes = %v", err)
	}
	bad := stageAll(t, r, StageRequest{Path: "f", Size: 4, SHA256: sum("abcd")}, []byte("abce"), 4)
	if _, err := r.Commit(bad); !errors.Is(err, ErrDigest) {
		t.Fatalf("commit with another digest = %v", err)
	}
	write(t, filepath.Join(root, "e"), "base")
	s2 := stageAll(t, r, StageRequest{Path: "e", Size: 3, SHA256: sum("new"), ExpectSHA256: sum("base")}, []byte("new"), 3)
	write(t, filepath.Join(root, "e"), "changed")
	if _, err := r.Commit(s2); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("commit after the file changed = %v", err)
	}
	s3 := stageAll(t, r, StageRequest{Path: "n", Size: 1, SHA256: sum("x"), ExpectAbsent: true}, []byte("x"), 1)
	write(t, filepath.Join(root, "n"), "appeared")
	if _, err := r.Commit(s3); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("commit after the file appeared = %v", err)
	}
	for p, want := range map[string]string{"e": "changed", "n": "appeared"} {
		if got, _ := os.ReadFile(filepath.Join(root, p)); string(got) != want {
			t.Fatalf("%s = %q, want %q", p, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("f exists after failed commits: %v", err)
	}
	for _, n := range entries(t, root) {
		if n != "a" && n != "hello.txt" && n != "e" && n != "n" {
			t.Fatalf("left behind: %s", n)
		}
	}
}

// TestReadAt reads a file in chunks at offsets; past the end is invalid,
// at the end empty.
func TestReadAt(t *testing.T) {
	r, root, _ := tree(t)
	content := make([]byte, 100_000)
	rand.Read(content)
	if err := os.WriteFile(filepath.Join(root, "bin"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for off := int64(0); ; {
		b, size, err := r.ReadAt("bin", off, 30_000)
		if err != nil || size != int64(len(content)) {
			t.Fatalf("ReadAt(%d) = %d bytes, size %d, %v", off, len(b), size, err)
		}
		if len(b) == 0 {
			break
		}
		got = append(got, b...)
		off += int64(len(b))
	}
	if !bytes.Equal(got, content) {
		t.Fatal("chunks differ from the file")
	}
	if b, _, err := r.ReadAt("bin", 99_990, 100); err != nil || !bytes.Equal(b, content[99_990:]) {
		t.Fatalf("read at 99990 = %d bytes, %v", len(b), err)
	}
	if _, _, err := r.ReadAt("bin", 100_001, 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("read past the end = %v", err)
	}
}
