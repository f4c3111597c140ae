package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationVMSavedStateImage: with a saved state and the guest
// image, the template boots the image over its writable disk and is
// saved with it; each computer restores onto a copy-on-write disk over
// the template's, which QEMU holds read-only (as the base image), and a
// file one computer writes is not in the next one started from the same
// state. It logs create -> first command from the saved state against a
// cold boot of the image, in the same run.
func TestIntegrationVMSavedStateImage(t *testing.T) {
	testenv.Require(t, "root", "qemu", "guestimage")
	p, base := testProvisioner(t)
	p.cfg.StateDir = filepath.Join(base, "state")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	limits := api.Limits{MemoryBytes: 192 << 20, DiskBytes: 64 << 20}

	a, _ := firstCommand(t, ctx, p, filepath.Join(base, "a"), limits) // makes the slot
	if !a.overlaid() {
		t.Fatal("computer a's disk is not a copy-on-write layer over the saved state's")
	}
	slot := filepath.Join(p.cfg.StateDir, fmt.Sprintf("m192-d%d", limits.DiskBytes))
	if a.saved.dir != slot {
		t.Fatalf("slot %s, want %s (one per RAM and disk size)", a.saved.dir, slot)
	}
	fi, err := os.Stat(a.saved.disk)
	if err != nil || fi.Mode().Perm() != 0o444 || fi.Size() != limits.DiskBytes {
		t.Fatalf("the slot's disk: %v, %v; want 0444 and %d bytes", fi, err, limits.DiskBytes)
	}
	before := fileSHA256(t, a.saved.disk)
	img, _ := p.guestImage()
	checkOpenModes(t, a.vm.PID(), map[string]int{img.Path: syscall.O_RDONLY, a.saved.disk: syscall.O_RDONLY,
		a.diskPath(): syscall.O_RDWR})
	if out := execIn(t, ctx, a, "/bin/sh", "-c", "echo secret-of-a > "+GuestRoot+"/a.txt && sync && cat "+GuestRoot+"/a.txt"); out != "secret-of-a\n" {
		t.Fatalf("write in a: %q", out)
	}

	b, saved := firstCommand(t, ctx, p, filepath.Join(base, "b"), limits)
	if b.saved == nil || b.saved.dir != slot {
		t.Fatal("computer b did not start from the same slot")
	}
	out := execIn(t, ctx, b, "/bin/sh", "-c", "ls "+GuestRoot+"/a.txt 2>&1; echo b > "+GuestRoot+"/b.txt && cat "+GuestRoot+"/b.txt")
	if strings.Contains(out, "secret") || !strings.Contains(out, "No such file") || !strings.HasSuffix(out, "b\n") {
		t.Fatalf("in b, a's files and b's own write: %q; want a's absent and b's there", out)
	}
	closeGone(t, ctx, a)
	closeGone(t, ctx, b)
	if after := fileSHA256(t, filepath.Join(slot, "disk.raw")); after != before {
		t.Fatalf("the slot's disk changed under two computers: %s, then %s", before, after)
	}

	coldP := NewProvisioner(Config{Bins: p.cfg.Bins, Accel: AccelTCG, Log: t.Logf})
	c, cold := firstCommand(t, ctx, coldP, filepath.Join(base, "c"), limits)
	if c.saved != nil {
		t.Fatal("the cold computer started from a saved state")
	}
	closeGone(t, ctx, c)
	t.Logf("BENCH create -> first command, TCG, guest image: saved state %s, cold boot %s (ratio %.2f)",
		saved.Round(time.Millisecond), cold.Round(time.Millisecond), float64(saved)/float64(cold))
}

// firstCommand prepares and grants a computer and runs sh -c true in it
// through the custodian's path; it returns the machine (closed at the
// test's end) and the time from Prepare to the command's answer.
func firstCommand(t *testing.T, ctx context.Context, p *Provisioner, dir string, l api.Limits) (*Machine, time.Duration) {
	t.Helper()
	start := time.Now()
	am, err := p.Prepare(ctx, dir, l)
	if err != nil {
		t.Fatal(err)
	}
	m := am.(*Machine)
	t.Cleanup(func() { m.Close(context.Background()) })
	if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if out := execIn(t, ctx, m, "/bin/sh", "-c", "true"); out != "" {
		t.Fatalf("sh -c true printed %q", out)
	}
	return m, time.Since(start)
}

// checkOpenModes: QEMU (pid) holds each file of want open, and only with
// that access mode (O_RDONLY, O_RDWR), read from /proc/PID/fdinfo. The
// computer's own disk, O_RDWR, is the positive control that the check
// reads the modes it means.
func checkOpenModes(t *testing.T, pid int, want map[string]int) {
	t.Helper()
	got := map[string][]int{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if _, ok := want[target]; err != nil || !ok {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				var flags int
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%o", &flags); err != nil {
					t.Fatalf("fdinfo flags %q: %v", v, err)
				}
				got[target] = append(got[target], flags&syscall.O_ACCMODE)
			}
		}
	}
	for path, mode := range want {
		if modes := got[path]; len(modes) == 0 || slices.ContainsFunc(modes, func(m int) bool { return m != mode }) {
			t.Errorf("QEMU holds %s with access modes %v, want only %d", path, modes, mode)
		}
	}
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	h := sha256.New()
	if err := hashFile(h, path); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
