package vmguest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/vm/ctl"
)

// TestRefusalLogIsBounded: lines append in order, and a line that would
// take the file past ctl.MaxRefusalLogBytes moves it to ".1" first, so
// the two hold at most twice that; the file is 0644 whatever the umask.
func TestRefusalLogIsBounded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "egress")
	line := []byte(strings.Repeat("x", 1023) + "\n")
	n := 3*ctl.MaxRefusalLogBytes/len(line) + 1
	for i := 0; i < n; i++ {
		if err := appendRefusal(dir, line); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(dir, filepath.Base(ctl.RefusalLog))
	cur, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(log + ".1")
	if err != nil {
		t.Fatal(err)
	}
	if len(cur) > ctl.MaxRefusalLogBytes || len(old) > ctl.MaxRefusalLogBytes || len(old) == 0 {
		t.Fatalf("file %d bytes and .1 %d bytes, bound %d", len(cur), len(old), ctl.MaxRefusalLogBytes)
	}
	if !bytes.HasSuffix(cur, line) || len(cur)%len(line) != 0 {
		t.Fatalf("the file does not hold whole lines: %d bytes", len(cur))
	}
	for _, p := range []string{dir, log} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]os.FileMode{dir: 0o755, log: 0o644}[p]; st.Mode().Perm() != want {
			t.Errorf("%s: mode %o, want %o", p, st.Mode().Perm(), want)
		}
	}
}

// TestRefusalLogFollowsNoSymlink: a symlink in the log's place is not
// written through (the positive control is the test above).
func TestRefusalLogFollowsNoSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, filepath.Base(ctl.RefusalLog))); err != nil {
		t.Fatal(err)
	}
	if err := appendRefusal(dir, []byte("x\n")); err == nil {
		t.Fatal("appended through a symlink")
	}
	if b, _ := os.ReadFile(target); len(b) != 0 {
		t.Fatalf("the symlink's target got %q", b)
	}
}
