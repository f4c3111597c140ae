// Package cgrouptest gives root tests of the receiver a private cgroup v2
// directory to contain children in. It is a test helper only.
package cgrouptest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/tetherdev/tether/receiver/cgroup2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// Hint says how to give a machine what Parent needs.
const Hint = "mount a writable cgroup2 file system (mount -t cgroup2 none /sys/fs/cgroup) on a kernel >= 5.14 (cgroup.kill)"

// Parent returns a fresh directory in a writable cgroup2 mount (the pure
// v2 /sys/fs/cgroup, or a hybrid system's /sys/fs/cgroup/unified), where
// the test may create child cgroups. Cleanup kills every process left in
// it, removes its children and then it, and fails the test if one cannot
// be removed. It needs root and a usable cgroup2 mount (the testenv gate:
// skipped with a hint, or failed when TETHER_TEST_REQUIRE names them).
func Parent(t testing.TB) string {
	t.Helper()
	testenv.Require(t, "root", "cgroup2")
	mount, err := Mount()
	if err != nil {
		t.Fatalf("cgroup2: %v; fix: %s", err, Hint)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	dir := filepath.Join(mount, "tether-test-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("cgroup2: create %s: %v; fix: %s", dir, err, Hint)
	}
	t.Cleanup(func() {
		if err := Remove(dir); err != nil {
			t.Errorf("cgroup2 test parent: %v", err)
		}
	})
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		t.Fatalf("cgroup2: %s has no cgroup.kill (%v); fix: %s", dir, err, Hint)
	}
	return dir
}

// Mount finds the first writable cgroup2 mount of this process.
func Mount() (string, error) { return cgroup2.Mount() }

// Remove kills every process in the cgroup dir and its children, waits
// (bounded) until they are gone and removes the children, then dir.
func Remove(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kill %s: %w", dir, err)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for {
		err := unix.Rmdir(dir)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if err != unix.EBUSY || time.Now().After(deadline) {
			return fmt.Errorf("remove %s: %w", dir, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Rel returns dir as /proc/<pid>/cgroup names it: relative to the cgroup2
// mount, with a leading slash. It assumes the test runs in the root
// cgroup namespace.
func Rel(t testing.TB, dir string) string {
	t.Helper()
	mount, err := Mount()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(mount, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		t.Fatalf("%s is not beneath the cgroup2 mount %s", dir, mount)
	}
	return "/" + rel
}
