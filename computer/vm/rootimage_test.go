package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/vm/image"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationVMGuestImage: a VM computer made through the service
// boots the guest image as its root (an overlay of the read-only base
// and the writable disk): git, python3 with ssl and venv, curl and sh run
// as the grant's unprivileged uid through the custodian's configuration;
// a file written in the grant's root lives on the writable disk and
// survives a suspend and a resume; the shared base image is byte for
// byte what its manifest says after the computer is deleted.
func TestIntegrationVMGuestImage(t *testing.T) {
	testenv.Require(t, "root", "qemu", "guestimage")
	p, base := testProvisioner(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := openTierService(t, ctx, p, base)
	defer s.Close()
	alice := api.Caller{Owner: "alice"}
	start := time.Now()
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 192 << 20, DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "svc", "computers", c.ID)
	st := vmState(t, dir)
	d := dialerOf(t, c)
	if out := runVia(t, ctx, d, c.Tuple, "echo ok"); out != "ok\n" {
		t.Fatalf("sh -c 'echo ok' printed %q", out)
	}
	t.Logf("BENCH create -> first command, TCG cold boot, guest image: %s", time.Since(start).Round(time.Millisecond))
	for _, probe := range []struct{ line, want string }{
		{"id -u", fmt.Sprintf("%d\n", st.UID)},
		{"awk '$2 == \"/\" {print $3}' /proc/mounts", "overlay\n"},
		{"stat -f -c %T " + GuestRoot, "overlayfs\n"},
		{"readlink -f /bin/sh", "/bin/dash\n"},
		{"git --version | cut -d' ' -f1,2", "git version\n"},
		{"python3 -c 'import ssl, venv; print(ssl.OPENSSL_VERSION.split()[0])'", "OpenSSL\n"},
		{"curl --version | head -1 | cut -d' ' -f1", "curl\n"},
		{"setsid sh -c 'echo ok'", "ok\n"},
		{"flock " + GuestRoot + "/lock -c 'echo ok'", "ok\n"},
		// util-linux's su is setuid root in the image; it is inert because
		// the root is mounted nosuid and every command runs with
		// no_new_privs.
		{"stat -c %a /bin/su", "4755\n"},
		{`awk '$2 == "/" {print ($4 ~ /(^|,)nosuid(,|$)/)}' /proc/mounts`, "1\n"},
		{"awk '/^NoNewPrivs/ {print $2}' /proc/self/status", "1\n"},
	} {
		if out := runVia(t, ctx, d, c.Tuple, probe.line); out != probe.want {
			t.Errorf("%s printed %q, want %q", probe.line, out, probe.want)
		}
	}
	if st.UID == 0 {
		t.Fatal("the grant's uid is 0")
	}
	if out := runVia(t, ctx, d, c.Tuple, "echo kept > "+GuestRoot+"/f && sync && cat "+GuestRoot+"/f"); out != "kept\n" {
		t.Fatalf("write into the root: %q", out)
	}
	img, err := p.guestImage()
	if err != nil || img == nil {
		t.Fatalf("guest image %v, %v", img, err)
	}
	checkDiskModes(t, st.QEMUPID, img.Path, filepath.Join(dir, "qemu", "disk.ext4"))
	if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resume(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if out := runVia(t, ctx, d, c.Tuple, "cat "+GuestRoot+"/f"); out != "kept\n" {
		t.Fatalf("after suspend and resume the file reads %q", out)
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	checkGone(t, p, dir, st)
	if err := img.Verify(); err != nil {
		t.Fatalf("the base image changed under a computer: %v", err)
	}
}

// checkDiskModes: QEMU holds the shared base image open read-only (so
// not even the guest's kernel can write it) and the computer's own disk
// read-write, the positive control that the check reads the modes it
// means; both read from /proc/PID/fdinfo.
func checkDiskModes(t *testing.T, pid int, basePath, diskPath string) {
	t.Helper()
	modes := map[string][]int{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || (target != basePath && target != diskPath) {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var flags int
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%o", &flags); err != nil {
					t.Fatalf("fdinfo flags %q: %v", v, err)
				}
			}
		}
		modes[target] = append(modes[target], flags&syscall.O_ACCMODE)
	}
	if got := modes[basePath]; len(got) == 0 || slices.ContainsFunc(got, func(m int) bool { return m != syscall.O_RDONLY }) {
		t.Errorf("QEMU holds the base image %s with access modes %v, want only O_RDONLY", basePath, got)
	}
	if got := modes[diskPath]; !slices.Contains(got, syscall.O_RDWR) {
		t.Errorf("control: QEMU holds the writable disk with access modes %v, want O_RDWR among them", got)
	}
}

// TestIntegrationVMInitramfsOnly: with GuestImageOff the guest boots
// its initramfs alone (busybox, no git), as on a machine with no image.
func TestIntegrationVMInitramfsOnly(t *testing.T) {
	p, base := testProvisioner(t)
	p.cfg.GuestImage = GuestImageOff
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	am, err := p.Prepare(ctx, filepath.Join(base, "vm"), api.Limits{MemoryBytes: 192 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m := am.(*Machine)
	defer m.Close(context.Background())
	if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	out := execIn(t, ctx, m, "/bin/sh", "-c", "readlink /bin/sh; command -v git || echo no-git")
	if out != "/bin/busybox\nno-git\n" {
		t.Fatalf("the initramfs guest printed %q", out)
	}
	if _, err := os.Stat(m.diskPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an initramfs guest has a disk: %v", err)
	}
}

// TestGuestImageChoice: no image where none is named boots the
// initramfs; a named directory without one, or an image whose digest is
// not its manifest's, refuses (ErrConfig), never boots it.
func TestGuestImageChoice(t *testing.T) {
	t.Setenv("TETHER_CACHE", t.TempDir())
	if img, err := NewProvisioner(Config{}).guestImage(); img != nil || err != nil {
		t.Fatalf("empty cache: %v, %v; want no image and no error", img, err)
	}
	if img, err := NewProvisioner(Config{GuestImage: GuestImageOff}).guestImage(); img != nil || err != nil {
		t.Fatalf("off: %v, %v", img, err)
	}
	missing := filepath.Join(t.TempDir(), "none")
	if _, err := NewProvisioner(Config{GuestImage: missing}).guestImage(); !errors.Is(err, ErrConfig) || !errors.Is(err, image.ErrAbsent) {
		t.Fatalf("named but absent: %v", err)
	}
	dir := t.TempDir()
	data := make([]byte, 4096)
	if err := os.WriteFile(filepath.Join(dir, "rootfs.ext4"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := `{"format":"tether-guestimage/1","image":"rootfs.ext4","image_sha256":"` + strings.Repeat("0", 64) +
		`","image_bytes":4096,"source_date_epoch":1,"uuid":"5f2b1c3e-8d4a-4e6b-9c2d-1a2b3c4d5e6f",` +
		`"packages":[{"name":"bash","version":"5","deb":"bash_5_amd64.deb","sha256":"` + strings.Repeat("1", 64) + `"}]}`
	if err := os.WriteFile(filepath.Join(dir, image.ManifestName), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := NewProvisioner(Config{GuestImage: dir}).guestImage(); !errors.Is(err, image.ErrDigest) {
		t.Fatalf("tampered image: %v, want ErrDigest", err)
	}
}

// BenchmarkVMCreateToFirstCommandRoot: Prepare, Grant and a first
// command (sh -c true) of a 192 MiB VM computer under TCG from a cold
// boot, with the guest image as its root and with the initramfs alone.
func BenchmarkVMCreateToFirstCommandRoot(b *testing.B) {
	testenv.Require(b, "root", "qemu", "guestimage")
	ctx := context.Background()
	set, err := bins.Build(ctx, bins.Receiver, bins.VMGuest)
	if err != nil {
		b.Fatal(err)
	}
	base, err := filepath.EvalSymlinks(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	os.Chmod(filepath.Dir(base), 0o755)
	os.Chmod(base, 0o755)
	for _, root := range []struct{ name, image string }{{"image", ""}, {"initramfs", GuestImageOff}} {
		b.Run(root.name, func(b *testing.B) {
			p := NewProvisioner(Config{Bins: set, Accel: AccelTCG, GuestImage: root.image})
			for i := range b.N {
				am, err := p.Prepare(ctx, filepath.Join(base, fmt.Sprint(root.name, i)), api.Limits{MemoryBytes: 192 << 20})
				if err != nil {
					b.Fatal(err)
				}
				m := am.(*Machine)
				if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
					b.Fatal(err)
				}
				if out := execWith(b, ctx, m, m.Tuple(), "/bin/sh", "-c", "true"); out != "" {
					b.Fatalf("sh -c true printed %q", out)
				}
				b.StopTimer()
				if _, mem, err := m.cg.usage(); err == nil {
					b.ReportMetric(float64(mem)/(1<<20), "qemu-MiB")
				}
				if err := m.Close(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
