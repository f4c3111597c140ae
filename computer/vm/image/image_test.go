package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// fakeBuild writes an image of n bytes and its manifest into a fresh
// directory, as ci/guestimage lays them out.
func fakeBuild(t *testing.T, n int) (string, Manifest) {
	t.Helper()
	dir := t.TempDir()
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(dir, "rootfs.ext4"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	m := Manifest{Format: Format, Image: "rootfs.ext4", ImageSHA256: hex.EncodeToString(sum[:]), ImageBytes: int64(n),
		SourceDateEpoch: 1686355200, UUID: "5f2b1c3e-8d4a-4e6b-9c2d-1a2b3c4d5e6f",
		Packages: []Package{{Name: "bash", Version: "5.2.15-2+b13", Deb: "bash_5.2.15-2+b13_amd64.deb", SHA256: hex.EncodeToString(sum[:])}}}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, m
}

// TestLoadVerifies: an intact build loads; one flipped byte of the image
// fails with ErrDigest (and the same build loaded before the flip is the
// positive control that the check passes on the intact image).
func TestLoadVerifies(t *testing.T) {
	dir, m := fakeBuild(t, 8192)
	img, err := Load(dir)
	if err != nil {
		t.Fatalf("intact build: %v", err)
	}
	if img.Digest() != "sha256:"+m.ImageSHA256 || !img.Manifest.Has("bash") || img.Manifest.Has("zsh") {
		t.Fatalf("loaded %+v", img)
	}
	f, err := os.OpenFile(img.Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, 4000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Load(dir); !errors.Is(err, ErrDigest) {
		t.Fatalf("Load of a modified image = %v, want ErrDigest", err)
	}
	if _, err := Find(dir); err != nil {
		t.Fatalf("Find (no hashing) of the same-sized image: %v", err)
	}
}

// TestFindAbsent: no directory, no manifest, or no image is ErrAbsent;
// an image of another size than the manifest's is ErrDigest.
func TestFindAbsent(t *testing.T) {
	if _, err := Find(filepath.Join(t.TempDir(), "none")); !errors.Is(err, ErrAbsent) {
		t.Fatalf("missing dir: %v", err)
	}
	if _, err := Find(t.TempDir()); !errors.Is(err, ErrAbsent) {
		t.Fatalf("no manifest: %v", err)
	}
	dir, _ := fakeBuild(t, 4096)
	if err := os.Truncate(filepath.Join(dir, "rootfs.ext4"), 8192); err != nil {
		t.Fatal(err)
	}
	if _, err := Find(dir); !errors.Is(err, ErrDigest) {
		t.Fatalf("wrong size: %v", err)
	}
	os.Remove(filepath.Join(dir, "rootfs.ext4"))
	if _, err := Find(dir); !errors.Is(err, ErrAbsent) {
		t.Fatalf("no image: %v", err)
	}
}

// TestManifestRefusals: each malformed field is refused.
func TestManifestRefusals(t *testing.T) {
	_, good := fakeBuild(t, 4096)
	if err := good.Validate(); err != nil {
		t.Fatalf("control: the good manifest is refused: %v", err)
	}
	for name, mut := range map[string]func(*Manifest){
		"format":        func(m *Manifest) { m.Format = "tether-guestimage/0" },
		"image path":    func(m *Manifest) { m.Image = "../etc/shadow" },
		"image dotdot":  func(m *Manifest) { m.Image = ".." },
		"image sha":     func(m *Manifest) { m.ImageSHA256 = "abc" },
		"image bytes":   func(m *Manifest) { m.ImageBytes = 4097 },
		"uuid":          func(m *Manifest) { m.UUID = "random" },
		"no packages":   func(m *Manifest) { m.Packages = nil },
		"package twice": func(m *Manifest) { m.Packages = append(m.Packages, m.Packages[0]) },
		"package name":  func(m *Manifest) { m.Packages[0].Name = "a b" },
		"package sha":   func(m *Manifest) { m.Packages[0].SHA256 = "" },
	} {
		m := good
		m.Packages = append([]Package(nil), good.Packages...)
		mut(&m)
		if err := m.Validate(); !errors.Is(err, ErrManifest) {
			t.Errorf("%s: Validate = %v, want ErrManifest", name, err)
		}
	}
	if _, err := DecodeManifest([]byte(`{"format":"tether-guestimage/1","extra":1}`)); !errors.Is(err, ErrManifest) {
		t.Errorf("unknown field: %v", err)
	}
}

// TestDefaultDirIsTheGate: the "guestimage" gate checks the directory
// the provisioner boots from.
func TestDefaultDirIsTheGate(t *testing.T) {
	for _, cache := range []string{"", t.TempDir()} {
		t.Setenv("TETHER_CACHE", cache)
		if got, want := testenv.GuestImageDir(), DefaultDir(); got != want {
			t.Errorf("TETHER_CACHE=%q: the gate checks %s, the provisioner boots %s", cache, got, want)
		}
	}
}

// TestCachedImageVerifies: the image ci/setup built matches its
// manifest and holds the userland it promises.
func TestCachedImageVerifies(t *testing.T) {
	testenv.Require(t, "guestimage")
	img, err := Load(DefaultDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"bash", "coreutils", "util-linux", "git", "python3", "python3-venv", "curl", "ca-certificates"} {
		if !img.Manifest.Has(p) {
			t.Errorf("the manifest lacks %s", p)
		}
	}
	t.Logf("guest image %s: %d packages, %d MiB", img.Digest(), len(img.Manifest.Packages), img.Manifest.ImageBytes>>20)
}

// TestIntegrationReproducibleBuild: ci/guestimage run twice from the
// same package set gives byte-identical images (the same digest).
func TestIntegrationReproducibleBuild(t *testing.T) {
	testenv.Require(t, "root", "guestimage")
	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "..", "..", "..", "ci", "guestimage")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var digests []string
	for _, name := range []string{"a", "b"} {
		out := filepath.Join(t.TempDir(), name)
		start := time.Now()
		if b, err := exec.CommandContext(ctx, script, "-o", out).CombinedOutput(); err != nil {
			t.Fatalf("ci/guestimage -o: %v\n%s", err, b)
		}
		img, err := Load(out)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("build %s: %s in %s", name, img.Digest(), time.Since(start).Round(time.Millisecond))
		digests = append(digests, img.Digest())
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds differ: %s and %s", digests[0], digests[1])
	}
}
