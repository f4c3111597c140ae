package fsops

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// holdWriteLease takes a write lease (fcntl F_SETLEASE F_WRLCK) on path,
// as a process in the computer that owns the file can, and returns its
// release (also run when the test ends). No F_SETOWN: breaking it
// signals nobody. Until the release, any blocking open of path waits for
// the lease-break time (45 s by default).
func holdWriteLease(t *testing.T, path string) (release func()) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		f.Close()
		t.Fatalf("F_SETLEASE F_WRLCK: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
			f.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// TestAttackLeasedFileIsBusyNotEscape: a file another process holds a
// write lease on cannot be opened without blocking; the receiver says so
// (ErrBusy) instead of calling it a path escape, and changes nothing.
func TestAttackLeasedFileIsBusyNotEscape(t *testing.T) {
	r, root, _ := tree(t)
	path := filepath.Join(root, "a", "leased.txt")
	write(t, path, "held\n")
	release := holdWriteLease(t, path)
	sum := sha256.Sum256([]byte("held\n"))
	_, err := r.Write(WriteRequest{Path: "a/leased.txt", Content: []byte("new\n"), ExpectSHA256: hex.EncodeToString(sum[:])})
	if !errors.Is(err, ErrBusy) || errors.Is(err, ErrEscape) {
		t.Fatalf("write (edit) of a leased file: %v, want ErrBusy", err)
	}
	if _, err := r.Read("a/leased.txt", 0, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("read of a leased file: %v, want ErrBusy", err)
	}
	if _, err := r.Hash([]string{"a/leased.txt"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("hash of a leased file: %v, want ErrBusy", err)
	}
	// An escape is still an escape, leased or not.
	if _, err := r.Read("../outside/secret", 0, 0); !errors.Is(err, ErrEscape) {
		t.Fatalf("escape next to a lease: %v", err)
	}
	release()
	if got, _ := os.ReadFile(path); string(got) != "held\n" {
		t.Fatalf("leased file changed to %q", got)
	}
	if _, err := r.Read("a/leased.txt", 0, 0); err != nil {
		t.Fatalf("read once the lease is given back: %v", err)
	}
}
