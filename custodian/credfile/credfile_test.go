package credfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
)

func write(t *testing.T, dir, name string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadAccepts(t *testing.T) {
	dir := t.TempDir()
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if data, err := Read(write(t, dir, "ok"+mode.String(), mode)); err != nil || string(data) != "secret" {
			t.Errorf("mode %v: %q, %v", mode, data, err)
		}
	}
}

func TestReadRefusesModes(t *testing.T) {
	dir := t.TempDir()
	for _, mode := range []os.FileMode{0o640, 0o604, 0o660, 0o644, 0o602, 0o610} {
		_, err := Read(write(t, dir, "m"+mode.String(), mode))
		var ue *UnsafeError
		if !errors.Is(err, ErrUnsafe) || !errors.As(err, &ue) {
			t.Errorf("mode %v accepted or wrong error: %v", mode, err)
		}
	}
}

func TestReadRefusesSymlinkAndNonRegular(t *testing.T) {
	dir := t.TempDir()
	target := write(t, dir, "target", 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	if _, err := Read(link); !errors.Is(err, ErrUnsafe) {
		t.Errorf("symlink: %v, want ErrUnsafe", err)
	}
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o700)
	if _, err := Read(sub); !errors.Is(err, ErrUnsafe) {
		t.Errorf("directory: %v, want ErrUnsafe", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := mkfifo(fifo); err == nil {
		if _, err := Read(fifo); !errors.Is(err, ErrUnsafe) {
			t.Errorf("fifo: %v, want ErrUnsafe", err)
		}
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, MaxSize+1), 0o600)
	if _, err := Read(big); !errors.Is(err, ErrUnsafe) {
		t.Errorf("oversize: %v, want ErrUnsafe", err)
	}
}

// TestIntegrationReadRefusesForeignOwner chowns a 0600 file to an
// unprivileged uid: a file another user owns could have been planted.
func TestIntegrationReadRefusesForeignOwner(t *testing.T) {
	testenv.Require(t, "root")
	dir := t.TempDir()
	p := write(t, dir, "foreign", 0o600)
	if err := os.Chown(p, 60123, 60123); err != nil {
		t.Fatal(err)
	}
	var ue *UnsafeError
	if _, err := Read(p); !errors.As(err, &ue) {
		t.Fatalf("foreign owner: %v, want UnsafeError", err)
	}
}

func TestReadPublic(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadPublic(write(t, dir, "pub644", 0o644)); err != nil {
		t.Fatalf("0644 trust anchor refused: %v", err)
	}
	for _, mode := range []os.FileMode{0o664, 0o646, 0o666} {
		if _, err := ReadPublic(write(t, dir, "pub"+mode.String(), mode)); !errors.Is(err, ErrUnsafe) {
			t.Errorf("mode %v (writable by others) accepted: %v", mode, err)
		}
	}
}
