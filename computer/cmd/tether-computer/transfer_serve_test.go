package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationTransfer drives export, import and copy through the
// shipped daemon and the real provisioner: a folder copied in is owned
// by the computer's uid and gid in its root and comes out with the same
// SHA-256; a running computer's export is refused; a suspended one's
// export imports as a new computer whose files belong to the NEW uid,
// and which exports to the same bytes;
// and an export with one flipped byte is refused with nothing made (no
// computer, no directory, no spool file).
func TestIntegrationTransfer(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer)
	if err != nil {
		t.Fatal(err)
	}
	dir := traversableDir(t, "tether-xfer-")
	sock := filepath.Join(dir, "api.sock")
	cl := client.Unix(sock)
	d := startDaemon(t, b, dir, "--pool", "0")
	comp := waitPoolCreate(ctx, t, cl)
	st := machineState(t, comp)

	src := makeProject(t)
	code, out, errs := cmd(t, "cp", src, comp.ID+":/work/proj", "--socket", sock)
	if code != 0 {
		t.Fatalf("cp in: %d %s", code, errs)
	}
	in := receiptOf(t, out)
	checkOwned(t, filepath.Join(st.Dir, "root", "work"), st.UID, st.GID, 8)
	back := filepath.Join(t.TempDir(), "back")
	code, out, errs = cmd(t, "cp", comp.ID+":/work/proj", back, "--socket", sock)
	if code != 0 {
		t.Fatalf("cp out: %d %s", code, errs)
	}
	if r := receiptOf(t, out); r.SHA256 != in.SHA256 {
		t.Errorf("cp out's SHA-256 %s, cp in's %s: want equal", r.SHA256, in.SHA256)
	}

	file := filepath.Join(t.TempDir(), "export.tar.zst")
	if code, _, errs := cmd(t, "export", comp.ID, "-o", file, "--socket", sock); code != exitFail || !strings.Contains(errs, "conflict") {
		t.Errorf("export of a running computer: %d %q, want conflict", code, errs)
	}
	if _, err := cl.Suspend(ctx, comp.ID); err != nil {
		t.Fatal(err)
	}
	code, out, errs = cmd(t, "export", comp.ID, "-o", file, "--socket", sock)
	if code != 0 {
		t.Fatalf("export: %d %s", code, errs)
	}
	digest, _, _ := strings.Cut(out, " ")
	checkFlippedImport(ctx, t, cl, sock, dir, file, digest)

	code, out, errs = cmd(t, "import", file, "--sha256", digest, "--ttl", "10m", "--socket", sock)
	if code != 0 {
		t.Fatalf("import: %d %s", code, errs)
	}
	var res api.ImportResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Receipt.SHA256 != digest || res.Computer.State != api.StateRunning {
		t.Fatalf("import answered %q (%v)", out, err)
	}
	st2 := machineState(t, res.Computer)
	if st2.UID == st.UID {
		t.Fatalf("the imported computer has the exported one's uid %d", st.UID)
	}
	checkOwned(t, filepath.Join(st2.Dir, "root", "work"), st2.UID, st2.GID, 8)
	if b, err := os.ReadFile(filepath.Join(st2.Dir, "root", "work", "proj", "README")); err != nil || string(b) != "hello\n" {
		t.Errorf("imported README: %q %v", b, err)
	}
	if _, err := cl.Suspend(ctx, res.Computer.ID); err != nil {
		t.Fatal(err)
	}
	code, out, errs = cmd(t, "export", res.Computer.ID, "-o", filepath.Join(t.TempDir(), "again.tar.zst"), "--socket", sock)
	if again, _, _ := strings.Cut(out, " "); code != 0 || again != digest {
		t.Errorf("the imported computer exports as %q (%d %s), the original as %s: want the same bytes", again, code, errs, digest)
	}
	if _, err := cl.Touch(ctx, comp.ID); err != nil {
		t.Errorf("touch of the suspended computer: %v", err)
	}
	if c, err := cl.Get(ctx, comp.ID); err != nil || c.State != api.StateRunning {
		t.Errorf("after touch: %v (state %q), want running", err, c.State)
	}
	for _, id := range []string{comp.ID, res.Computer.ID} {
		if err := cl.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// The receipts of an ended computer stay readable.
	code, out, errs = cmd(t, "receipts", comp.ID, "--socket", sock)
	if code != 0 || !strings.Contains(out, `"op": "export"`) || !strings.Contains(out, digest) {
		t.Errorf("receipts of the deleted computer: %d %s %s; want its export with sha256 %s", code, out, errs, digest)
	}
	d.stop(t, syscall.SIGTERM)
	out2, err := exec.CommandContext(ctx, b.Path(bins.Computer), "verify", "--dir", filepath.Join(dir, "state")).CombinedOutput()
	if err != nil || !strings.Contains(string(out2), "chain intact") {
		t.Fatalf("verify: %v\n%s", err, out2)
	}
}

// checkFlippedImport imports a copy of file with one byte flipped under
// file's digest: refused as bad_request, with no computer, no machine
// directory and no spool file left.
func checkFlippedImport(ctx context.Context, t *testing.T, cl *client.Client, sock, dir, file, digest string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x01
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) == digest {
		t.Fatal("the flip did not change the digest")
	}
	flipped := filepath.Join(t.TempDir(), "flipped.tar.zst")
	if err := os.WriteFile(flipped, data, 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := cl.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dirsBefore := entries(t, filepath.Join(dir, "state", "computers"))
	code, _, errs := cmd(t, "import", flipped, "--sha256", digest, "--socket", sock)
	if code != exitFail || !strings.Contains(errs, "bad_request") {
		t.Errorf("import of a flipped export: %d %q, want bad_request", code, errs)
	}
	after, err := cl.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("a refused import left %d computers, there were %d", len(after), len(before))
	}
	if got := entries(t, filepath.Join(dir, "state", "computers")); got != dirsBefore {
		t.Errorf("a refused import left %d machine directories, there were %d", got, dirsBefore)
	}
	if n := entries(t, filepath.Join(dir, "state", "spool")); n != 0 {
		t.Errorf("%d spool files left", n)
	}
}

// entries counts the entries of dir.
func entries(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// machineState reads the provisioner's state of comp's machine (its
// directory holds the custodian configuration).
func machineState(t *testing.T, comp api.Computer) provision.State {
	t.Helper()
	st, err := provision.ReadState(filepath.Dir(comp.CustodianConfig))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkOwned checks every entry beneath top (top included) belongs to
// uid and gid, and that there are want of them.
func checkOwned(t *testing.T, top string, uid, gid uint32, want int) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		s := fi.Sys().(*syscall.Stat_t)
		if s.Uid != uid || s.Gid != gid {
			t.Errorf("%s is owned by %d:%d, want the computer's %d:%d", p, s.Uid, s.Gid, uid, gid)
		}
		n++
		return nil
	})
	if err != nil || n != want {
		t.Errorf("walk %s: %d entries (%v), want %d", top, n, err, want)
	}
}
