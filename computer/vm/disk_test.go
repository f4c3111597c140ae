package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/archive"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// recorder is p, keeping the machines its Prepare made by directory,
// so a test sees what the service does not show (the receiver's key).
type recorder struct {
	*Provisioner
	mu   sync.Mutex
	made map[string]*Machine
}

func (r *recorder) Prepare(ctx context.Context, dir string, l api.Limits) (api.Machine, error) {
	m, err := r.Provisioner.Prepare(ctx, dir, l)
	if err == nil {
		r.mu.Lock()
		r.made[dir] = m.(*Machine)
		r.mu.Unlock()
	}
	return m, err
}

func (r *recorder) machine(t *testing.T, dir string) *Machine {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.made[dir]
	if m == nil {
		t.Fatalf("no machine prepared in %s", dir)
	}
	return m
}

// vmService is a service offering tier vm from p (recorded) in
// base/svc, with maxDisk as its disk cap (0: the default).
func vmService(t *testing.T, ctx context.Context, p *Provisioner, base string, maxDisk int64) (*service.Service, *recorder) {
	t.Helper()
	rec := &recorder{Provisioner: p, made: map[string]*Machine{}}
	s, err := service.Open(ctx, service.Config{Dir: filepath.Join(base, "svc"),
		Provisioner:  provision.NewProvisioner(provision.Config{Bins: p.cfg.Bins}),
		Provisioners: map[string]api.Provisioner{api.TierVM: rec}, MaxLimits: api.Limits{DiskBytes: maxDisk}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, rec
}

// TestIntegrationVMExport: a VM computer started from a saved
// state with the guest image writes a file (no sync of its own: suspend
// flushes the guest), is suspended and exported: the export is its disk
// (flattened from its copy-on-write layer), holds none of the receiver's
// key, and an import of tier vm boots a new computer on it where the
// file is, with an identity of its own; copy out of it gives the file
// and a copy in is read there (both through its guest). Deleting both
// leaves nothing.
func TestIntegrationVMExport(t *testing.T) {
	testenv.Require(t, "root", "qemu", "guestimage")
	p, base := testProvisioner(t)
	p.cfg.StateDir = filepath.Join(base, "state")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, made := vmService(t, ctx, p, base, 0)
	alice := api.Caller{Owner: "alice"}
	a, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 192 << 20, DiskBytes: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	da := dialerOf(t, a)
	if out := runVia(t, ctx, da, a.Tuple, "echo carried > "+GuestRoot+"/f.txt; cat /etc/machine-id"); len(out) != 33 {
		t.Fatalf("write in a: %q", out)
	}
	idA := runVia(t, ctx, da, a.Tuple, "cat /etc/machine-id")
	dirA := filepath.Join(base, "svc", "computers", a.ID)
	stA := vmState(t, dirA)
	if _, _, err := s.Export(ctx, alice, a.ID); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("export of a running computer: %v, want conflict", err)
	}
	if _, err := s.Suspend(ctx, alice, a.ID); err != nil {
		t.Fatal(err)
	}
	rc, rec, err := s.Export(ctx, alice, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	export, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if h := sha256.Sum256(export); hex.EncodeToString(h[:]) != rec.SHA256 || rec.Bytes != int64(len(export)) || rec.Op != api.OpExport {
		t.Fatalf("receipt %+v for %d bytes", rec, len(export))
	}
	checkNoKey(t, export, keyLineOf(t, made.machine(t, dirA)))
	if _, err := os.Stat(filepath.Join(dirA, "qemu", "export.raw")); !os.IsNotExist(err) {
		t.Errorf("the flattened disk is left in QEMU's directory: %v", err)
	}

	res, err := s.Import(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 192 << 20}}, bytes.NewReader(export), rec.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	d := res.Computer
	if d.Limits.DiskBytes != 32<<20 || res.Receipt.SHA256 != rec.SHA256 || res.Receipt.Op != api.OpImport {
		t.Fatalf("import: disk %d, receipt %+v", d.Limits.DiskBytes, res.Receipt)
	}
	dd := dialerOf(t, d)
	if out := runVia(t, ctx, dd, d.Tuple, "cat "+GuestRoot+"/f.txt"); out != "carried\n" {
		t.Fatalf("the imported computer's file reads %q", out)
	}
	if idD := runVia(t, ctx, dd, d.Tuple, "cat /etc/machine-id"); idD == idA {
		t.Fatalf("the imported computer kept the exported one's machine id %q", idD)
	}
	if b := copyOutFile(t, ctx, s, d.ID, "f.txt"); string(b) != "carried\n" {
		t.Errorf("copy out of the imported computer's file: %q", b)
	}
	if _, err := s.CopyIn(ctx, alice, d.ID, "/in", bytes.NewReader(tarOf(t, [2]string{"g.txt", "copied in\n"}))); err != nil {
		t.Fatalf("copy in to the imported computer: %v", err)
	}
	if out := runVia(t, ctx, dd, d.Tuple, "cat "+GuestRoot+"/in/g.txt"); out != "copied in\n" {
		t.Fatalf("the grant's uid reads the copied-in file as %q", out)
	}
	dirD := filepath.Join(base, "svc", "computers", d.ID)
	stD := vmState(t, dirD)
	for _, c := range []struct {
		id, dir string
		st      state
	}{{a.ID, dirA, stA}, {d.ID, dirD, stD}} {
		if err := s.Delete(ctx, alice, c.id); err != nil {
			t.Fatal(err)
		}
		checkGone(t, p, c.dir, c.st)
	}
}

// keyLineOf is a line of the base64 body of the receiver's private key
// m injected into its guest.
func keyLineOf(t *testing.T, m *Machine) string {
	t.Helper()
	pem, err := m.creds.Server.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(pem), "\n")
	if len(lines) < 3 || len(lines[1]) < 40 {
		t.Fatalf("key PEM %d lines", len(lines))
	}
	return lines[1]
}

// checkNoKey: the export's disk does not hold line (a line of the
// receiver's key); the positive control finds the line in a disk that
// holds it.
func checkNoKey(t *testing.T, export []byte, line string) {
	t.Helper()
	var disk bytes.Buffer
	if _, _, err := archive.ReadDisk(context.Background(), bytes.NewReader(export), archive.DiskOptions{MaxDiskBytes: 1 << 30}, &disk); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(disk.Bytes(), []byte(line)) {
		t.Fatal("the exported disk holds the receiver's private key")
	}
	control := append(bytes.Clone(disk.Bytes()[:1<<20]), line...)
	if !bytes.Contains(control, []byte(line)) {
		t.Fatal("control: the search does not find the key's line")
	}
}

// TestIntegrationVMImportRefused: an import of tier vm that names
// another base image, a tampered stream, a disk over the service's cap,
// a disk limit other than the disk's, something that is no disk export,
// or a well-formed disk export this service did not export (a crafted
// file system) is refused with bad_request and makes nothing (no
// computer, no directory, no QEMU). No guest boots; the import of a
// real export (TestIntegrationVMExport) is the positive control.
func TestIntegrationVMImportRefused(t *testing.T) {
	testenv.Require(t, "root", "qemu", "guestimage")
	p, base := testProvisioner(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	img, err := p.guestImage()
	if err != nil || img == nil {
		t.Fatalf("guest image %v, %v", img, err)
	}
	s, _ := vmService(t, ctx, p, base, 128<<20)
	good := diskExport(t, img.Digest(), 16<<20)
	tampered := bytes.Clone(good)
	tampered[len(tampered)-40] ^= 1
	cases := []struct {
		name   string
		data   []byte
		sha    string
		limits api.Limits
	}{
		{"another base image", diskExport(t, "sha256:"+strings.Repeat("ab", 32), 16<<20), "", api.Limits{}},
		{"a tampered stream", tampered, digestOf(good), api.Limits{}},
		{"a disk over the service's cap", diskExport(t, img.Digest(), 256<<20), "", api.Limits{}},
		{"a disk limit other than the disk's", good, "", api.Limits{DiskBytes: 64 << 20}},
		{"a disk below the floor", diskExport(t, img.Digest(), 1<<20), "", api.Limits{}},
		{"not a disk export", []byte("\x28\xb5\x2f\xfd not a tar.zst"), "", api.Limits{}},
		{"a well-formed disk this service never exported", good, "", api.Limits{}},
	}
	alice := api.Caller{Owner: "alice"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sha := c.sha
			if sha == "" {
				sha = digestOf(c.data)
			}
			_, err := s.Import(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: c.limits}, bytes.NewReader(c.data), sha)
			if api.CodeOf(err) != api.CodeBadRequest {
				t.Fatalf("import: %v, want bad_request", err)
			}
			t.Logf("refused: %v", err)
			if !strings.Contains(err.Error(), "nothing was created") {
				t.Errorf("the refusal does not say nothing was made: %v", err)
			}
			if cs, err := s.List(ctx, alice); err != nil || len(cs) != 0 {
				t.Fatalf("computers after a refused import: %v, %v", cs, err)
			}
			if ents, _ := os.ReadDir(filepath.Join(base, "svc", "computers")); len(ents) != 0 {
				t.Fatalf("directories after a refused import: %v", ents)
			}
		})
	}
	// Control: the untouched export passes the same check.
	if n, err := p.CheckDisk(ctx, bytes.NewReader(good), 128<<20); err != nil || n != 16<<20 {
		t.Fatalf("control: CheckDisk of the untouched export: %d, %v", n, err)
	}
	if _, err := p.CheckDisk(ctx, bytes.NewReader(tampered), 128<<20); !errors.Is(err, api.ErrBadDisk) {
		t.Fatalf("CheckDisk of the tampered stream: %v, want ErrBadDisk", err)
	}
}

// diskExport is a disk export of size zero bytes (a sparse file) over
// the image named base.
func diskExport(t *testing.T, base string, size int64) []byte {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := archive.ExportDisk(context.Background(), &buf, base, f, size); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func digestOf(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// TestOpenQEMUFileRefuses: the host reads a disk from QEMU's directory
// only if it is a regular file of QEMU's uid, with one link, of the
// disk limit's size, not through a symlink: a QEMU that put a link to a
// host file there cannot have it exported. The right file is the
// positive control.
func TestOpenQEMUFileRefuses(t *testing.T) {
	testenv.Require(t, "root")
	dir := t.TempDir()
	m := &Machine{qemuUID: 60123, limits: api.Limits{DiskBytes: 1 << 20}}
	mk := func(name string, size int64, uid int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(os.Truncate(p, size), os.Chown(p, uid, uid)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := mk("disk", 1<<20, 60123)
	host := mk("host-secret", 1<<20, 0)
	link := filepath.Join(dir, "symlink")
	hard := filepath.Join(dir, "hardlink")
	if err := errors.Join(os.Symlink(host, link), os.Link(mk("twice", 1<<20, 60123), hard)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
	}{
		{"a file of another uid", host},
		{"a symlink to a host file", link},
		{"a file with two links", hard},
		{"a disk grown past its limit", mk("grown", 2<<20, 60123)},
	} {
		if f, _, err := m.openQEMUFile(c.path); err == nil {
			f.Close()
			t.Errorf("%s: opened", c.name)
		}
	}
	f, size, err := m.openQEMUFile(good)
	if err != nil || size != 1<<20 {
		t.Fatalf("control: QEMU's own disk: %d, %v", size, err)
	}
	f.Close()
}
