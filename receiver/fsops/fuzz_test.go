package fsops

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

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

// FuzzReadSelect: the streaming line selector and UTF-8 check, fed in
// pieces of any size, agree with the whole-buffer reference selection and
// utf8.Valid, and a bound below the selection's length reports overflow.
func FuzzReadSelect(f *testing.F) {
	for _, s := range []string{"", "a", "a\nb\n", "\n\n\n", "h\u00e9llo\nw\u00f6rld", "\xe2\x82", "\xff\n", "a\xe2\x82\xacb\n"} {
		f.Add([]byte(s), 0, 0, 1)
		f.Add([]byte(s), 2, 1, 2)
	}
	f.Fuzz(func(t *testing.T, in []byte, line, limit, piece int) {
		if line < 0 || limit < 0 || line > 1<<20 || limit > 1<<20 {
			return
		}
		piece = 1 + abs(piece)%(len(in)+1)
		want := string(refSelectLines(in, line, limit))
		if got := selectPieces(in, line, limit, piece); got != want {
			t.Fatalf("pieces of %d: %q, want %q", piece, got, want)
		}
		var u utf8Stream
		ok := true
		for rest := in; len(rest) > 0; {
			k := min(piece, len(rest))
			ok = u.write(rest[:k]) && ok
			rest = rest[k:]
		}
		if ok = ok && u.end(); ok != utf8.Valid(in) {
			t.Fatalf("streaming UTF-8 check %v, utf8.Valid %v", ok, utf8.Valid(in))
		}
		if len(want) > 0 {
			s := newLineSelector(line, limit, len(want)-1)
			s.write(in)
			if !s.overflow || s.out.Len() != 0 {
				t.Fatalf("bound %d below %d selected bytes: overflow %v, kept %d", len(want)-1, len(want), s.overflow, s.out.Len())
			}
		}
	})
}

func abs(n int) int {
	if n < 0 {
		if n = -n; n < 0 {
			return 0
		}
	}
	return n
}
