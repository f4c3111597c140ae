package service

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/tetherdev/tether/computer/api"
)

// diskProv is a strictProv whose machines export their disk and which
// imports disks: a disk export is, for this fake, "DISK " and a name.
type diskProv struct {
	*strictProv
	mu       sync.Mutex
	prepared int // PrepareDisk calls
}

// diskMachine is a strictMachine with a disk.
type diskMachine struct {
	*strictMachine
	disk []byte
}

func newDiskProv(t *testing.T) *diskProv {
	p := &diskProv{strictProv: newStrictProv(t)}
	p.wrap = func(m *strictMachine) api.Machine {
		return &diskMachine{strictMachine: m, disk: []byte("DISK " + m.dir)}
	}
	return p
}

func (m *diskMachine) ExportDisk(ctx context.Context, w io.Writer) (api.Transfer, error) {
	m.use("ExportDisk")
	m.p.mu.Lock()
	frozen := m.frozen
	m.p.mu.Unlock()
	if !frozen {
		m.p.t.Errorf("ExportDisk of a running machine %s", m.dir)
	}
	if _, err := w.Write(m.disk); err != nil {
		return api.Transfer{}, err
	}
	h := sha256.Sum256(m.disk)
	return api.Transfer{SHA256: hex.EncodeToString(h[:]), Bytes: int64(len(m.disk)), Files: 1}, nil
}

func (p *diskProv) CheckDisk(ctx context.Context, r io.Reader, max int64) (int64, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	if !bytes.HasPrefix(b, []byte("DISK ")) {
		return 0, fmt.Errorf("%w: not a disk export", api.ErrBadDisk)
	}
	if int64(len(b)) > max {
		return 0, fmt.Errorf("%w: over the cap", api.ErrBadDisk)
	}
	return int64(len(b)), nil
}

func (p *diskProv) PrepareDisk(ctx context.Context, dir string, l api.Limits, r io.Reader) (api.Machine, api.Transfer, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, api.Transfer{}, err
	}
	if l.DiskBytes != int64(len(b)) {
		p.t.Errorf("PrepareDisk with disk limit %d for a disk of %d bytes", l.DiskBytes, len(b))
	}
	p.mu.Lock()
	p.prepared++
	p.mu.Unlock()
	m, err := p.strictProv.Prepare(ctx, dir, l)
	if err != nil {
		return nil, api.Transfer{}, err
	}
	m.(*diskMachine).disk = b
	h := sha256.Sum256(b)
	return m, api.Transfer{SHA256: hex.EncodeToString(h[:]), Bytes: int64(len(b)), Files: 1}, nil
}

var (
	_ api.DiskImporter = (*diskProv)(nil)
	_ api.DiskExporter = (*diskMachine)(nil)
)

// TestDiskExportImport: a suspended computer of a tier whose machines
// export their disk exports it (a running one is conflict); an import
// of that tier of the export makes a computer on the disk, its disk
// limit the disk's size. Refused with bad_request before anything is
// made: what the provisioner says is no disk export, a disk this
// service never exported, a disk limit other than the disk's, and an
// import into a tier that imports no disks. (Copy in and out of a
// machine whose copies go through its guest: TestCopyThroughGuest, and
// on a real VM computer computer/vm.TestIntegrationVMCopy.)
func TestDiskExportImport(t *testing.T) {
	vm := newDiskProv(t)
	s, local := newTestService(t, Config{Provisioners: map[string]api.Provisioner{api.TierVM: vm}})
	ctx := context.Background()
	a, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM})
	if err != nil {
		t.Fatal(err)
	}
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
	export, _ := io.ReadAll(rc)
	rc.Close()
	if !strings.HasPrefix(string(export), "DISK ") || rec.SHA256 != digestHex(export) || rec.Op != api.OpExport {
		t.Fatalf("export %q, receipt %+v", export, rec)
	}

	other := []byte("DISK never exported here")
	for _, c := range []struct {
		name string
		data []byte
		l    api.Limits
	}{
		{"not a disk export", []byte("a tar.zst of files"), api.Limits{}},
		{"a disk this service never exported", other, api.Limits{}},
		{"a disk limit other than the disk's", export, api.Limits{DiskBytes: int64(len(export)) + 1}},
	} {
		_, err := s.Import(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: c.l}, bytes.NewReader(c.data), digestHex(c.data))
		if api.CodeOf(err) != api.CodeBadRequest {
			t.Fatalf("%s: %v, want bad_request", c.name, err)
		}
	}
	if n := vm.count("Prepare"); n != 1 || vm.prepared != 0 {
		t.Fatalf("refused imports made machines: %v", vm.allCalls())
	}

	res, err := s.Import(ctx, alice, api.CreateRequest{Tier: api.TierVM}, bytes.NewReader(export), rec.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if res.Computer.Tier != api.TierVM || res.Computer.Limits.DiskBytes != int64(len(export)) || res.Receipt.SHA256 != rec.SHA256 || vm.prepared != 1 {
		t.Fatalf("import: %+v (PrepareDisk %d)", res, vm.prepared)
	}
	if local.count("Prepare") != 0 {
		t.Fatalf("the default tier prepared: %v", local.allCalls())
	}

	plain := newStrictProv(t)
	s2, _ := newTestService(t, Config{Provisioners: map[string]api.Provisioner{api.TierVM: plain}})
	if _, err := s2.Import(ctx, alice, api.CreateRequest{Tier: api.TierVM}, bytes.NewReader(export), rec.SHA256); api.CodeOf(err) != api.CodeBadRequest || plain.count("Prepare") != 0 {
		t.Fatalf("import into a tier that imports no disks: %v (%v)", err, plain.allCalls())
	}
}

func digestHex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
