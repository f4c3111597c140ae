package fsops

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzResolveBeneath resolves arbitrary paths in a root full of hostile
// symlinks. Whatever resolves must lie beneath the root; everything else
// must fail with one of the package's errors.
func FuzzResolveBeneath(f *testing.F) {
	base := f.TempDir()
	root := filepath.Join(base, "root")
	for _, d := range []string{filepath.Join(root, "a", "b"), filepath.Join(base, "outside")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	links := map[string]string{"abs": "/etc", "out": "../outside", "deep": "a/b/../../../outside",
		"loop": "loop", "self": ".", "up": "a/..", "proc": "/proc/self/root", "b2": "a/b"}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			f.Fatal(err)
		}
	}
	r, err := OpenRoot(root, Owner{}, testLimits)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"", ".", "..", "a/b", "abs/passwd", "out", "deep", "loop", "self/self/a",
		"up/a/b/../..", "proc", "b2/../../..", "/", "a//b", "a/./b/", "x\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		fd, err := r.open(rel, unix.O_PATH, 0)
		if err != nil {
			if !knownError(err) {
				t.Fatalf("open %q: unclassified error %v", rel, err)
			}
			return
		}
		defer unix.Close(fd)
		where, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			t.Fatal(err)
		}
		if where != root && !strings.HasPrefix(where, root+"/") {
			t.Fatalf("%q resolved to %q, outside %q", rel, where, root)
		}
	})
}

func knownError(err error) bool {
	for _, e := range []error{ErrEscape, ErrNotFound, ErrNotDir, ErrInvalid, ErrNotRegular} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
