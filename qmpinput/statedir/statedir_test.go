package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestOpenRefusesUnsafe: a symlinked directory, a directory open to
// group or others, and a symlinked, group-readable or foreign file are
// refused; a missing directory is created 0700.
func TestOpenRefusesUnsafe(t *testing.T) {
	root := t.TempDir()
	fresh := filepath.Join(root, "state")
	d, err := Open(fresh)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(fresh); st.Mode().Perm() != 0o700 {
		t.Fatalf("created with %v", st.Mode())
	}
	t.Run("symlinked directory", func(t *testing.T) {
		link := filepath.Join(root, "link")
		os.Symlink(fresh, link)
		if _, err := Open(link); !errors.Is(err, ErrUnsafe) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("group readable directory", func(t *testing.T) {
		open := filepath.Join(root, "open")
		os.Mkdir(open, 0o750)
		os.Chmod(open, 0o750)
		if _, err := Open(open); !errors.Is(err, ErrUnsafe) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("symlinked file", func(t *testing.T) {
		os.WriteFile(filepath.Join(root, "target"), []byte("x"), 0o600)
		os.Symlink(filepath.Join(root, "target"), filepath.Join(fresh, "tokens.json"))
		defer os.Remove(filepath.Join(fresh, "tokens.json"))
		if _, err := d.ReadFile("tokens.json", 10); !errors.Is(err, ErrUnsafe) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("group readable file", func(t *testing.T) {
		p := filepath.Join(fresh, "audit.jsonl")
		os.WriteFile(p, nil, 0o640)
		os.Chmod(p, 0o640)
		defer os.Remove(p)
		if _, err := d.OpenFile("audit.jsonl", unix.O_RDONLY); !errors.Is(err, ErrUnsafe) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("file of another uid", func(t *testing.T) {
		testenv.Require(t, "root")
		p := filepath.Join(fresh, "foreign")
		os.WriteFile(p, nil, 0o600)
		os.Chown(p, 60001, 60001)
		defer os.Remove(p)
		var ue *UnsafeError
		if _, err := d.OpenFile("foreign", unix.O_RDONLY); !errors.As(err, &ue) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("atomic write and bound", func(t *testing.T) {
		if err := d.WriteAtomic("f", []byte("hello")); err != nil {
			t.Fatal(err)
		}
		if b, err := d.ReadFile("f", 5); err != nil || string(b) != "hello" {
			t.Fatalf("%q %v", b, err)
		}
		if _, err := d.ReadFile("f", 4); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestOpenFileRefusesPathNames(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, n := range []string{"../x", "a/b", "..", ""} {
		if _, err := d.OpenFile(n, unix.O_RDONLY); !errors.Is(err, ErrUnsafe) {
			t.Fatalf("%q: got %v", n, err)
		}
	}
}
