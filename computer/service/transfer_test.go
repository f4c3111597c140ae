package service

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/archive"
)

// Root makes strictMachine an api.Rooted whose root is DIR/root, written
// with the test's own ids.
func (m *strictMachine) Root() (string, int, int) {
	dir := filepath.Join(m.dir, "root")
	_ = os.MkdirAll(dir, 0o755)
	return dir, archive.Keep, archive.Keep
}

// projectTar is the tar stream of a small folder named proj.
func projectTar(t *testing.T) []byte {
	t.Helper()
	src := filepath.Join(t.TempDir(), "proj")
	if err := os.MkdirAll(filepath.Join(src, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "src", "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(filepath.Dir(src))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	var buf bytes.Buffer
	if _, err := archive.WriteTar(context.Background(), root, "proj", "", &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestTransfersKeepReceipts: copy in and out give the same digest; a
// running computer's export is a conflict, a suspended one's is the
// stream its receipt names; an import under another digest creates
// nothing (no record, no Prepare); the import under the right one makes
// a running computer holding the tree; every receipt is kept.
func TestTransfersKeepReceipts(t *testing.T) {
	s, prov := newTestService(t, Config{})
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	stream := projectTar(t)
	in, err := s.CopyIn(ctx, alice, c.ID, "/work", bytes.NewReader(stream))
	if err != nil || in.SHA256 != sum(stream) || in.Op != api.OpCopyIn || in.Path != "/work" {
		t.Fatalf("copy in: %+v %v", in, err)
	}
	_, err = s.CopyIn(ctx, alice, c.ID, "/work", bytes.NewReader(stream))
	wantCode(t, err, api.CodeConflict)
	body, out, err := s.CopyOut(ctx, alice, c.ID, "/work/proj")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(body)
	body.Close()
	if out.SHA256 != in.SHA256 || sum(got) != out.SHA256 || int64(len(got)) != out.Bytes {
		t.Errorf("copy out %+v (body %s), copy in %s: want one digest", out, sum(got), in.SHA256)
	}
	_, _, err = s.CopyOut(ctx, alice, c.ID, "/../etc")
	wantCode(t, err, api.CodeBadRequest)
	_, _, err = s.Export(ctx, alice, c.ID)
	wantCode(t, err, api.CodeConflict)
	if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	body, exp, err := s.Export(ctx, alice, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	export, _ := io.ReadAll(body)
	body.Close()
	if sum(export) != exp.SHA256 {
		t.Fatalf("export receipt %s, stream %s", exp.SHA256, sum(export))
	}
	prepared := prov.count("Prepare")
	flipped := bytes.Clone(export)
	flipped[len(flipped)/2] ^= 1
	_, err = s.Import(ctx, alice, api.CreateRequest{}, bytes.NewReader(flipped), exp.SHA256)
	wantCode(t, err, api.CodeBadRequest)
	if l, _ := s.List(ctx, alice); len(l) != 1 || prov.count("Prepare") != prepared {
		t.Fatalf("a refused import: %d computers, %d Prepares; want 1 and %d", len(l), prov.count("Prepare"), prepared)
	}
	res, err := s.Import(ctx, alice, api.CreateRequest{}, bytes.NewReader(export), exp.SHA256)
	if err != nil || res.Computer.State != api.StateRunning || res.Receipt.SHA256 != exp.SHA256 {
		t.Fatalf("import: %+v %v", res, err)
	}
	dir := filepath.Join(s.cfg.Dir, "computers", res.Computer.ID, "root", "work", "proj", "src", "main.go")
	if b, err := os.ReadFile(dir); err != nil || string(b) != "package main\n" {
		t.Errorf("imported file: %q %v", b, err)
	}
	rs, err := s.Receipts(ctx, alice, c.ID)
	if err != nil || len(rs) != 3 || rs[0].Op != api.OpCopyIn || rs[1].Op != api.OpCopyOut || rs[2].Op != api.OpExport {
		t.Errorf("receipts of %s: %+v %v, want copy in, copy out, export", c.ID, rs, err)
	}
	if rs, _ := s.Receipts(ctx, alice, res.Computer.ID); len(rs) != 1 || rs[0].Op != api.OpImport {
		t.Errorf("receipts of the import: %+v", rs)
	}
	if ents, err := os.ReadDir(filepath.Join(s.cfg.Dir, SpoolDir)); err != nil || len(ents) != 0 {
		t.Errorf("spool: %d files left (%v)", len(ents), err)
	}
}

// TestTransfersOwnerIsolation is the attack test of owner isolation in
// the service's transfers: bob naming alice's computer gets not_found
// from each, reported to OnDenied, and nothing is written. Positive
// control: alice's own calls succeed.
func TestTransfersOwnerIsolation(t *testing.T) {
	var mu sync.Mutex
	var denied []string
	s, _ := newTestService(t, Config{OnDenied: func(c api.Caller, id string) {
		mu.Lock()
		denied = append(denied, c.Owner+":"+id)
		mu.Unlock()
	}})
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	stream := projectTar(t)
	_, err = s.CopyIn(ctx, bob, c.ID, "/work", bytes.NewReader(stream))
	wantCode(t, err, api.CodeNotFound)
	_, _, err = s.CopyOut(ctx, bob, c.ID, "/work")
	wantCode(t, err, api.CodeNotFound)
	_, _, err = s.Export(ctx, bob, c.ID)
	wantCode(t, err, api.CodeNotFound)
	_, err = s.TouchAs(ctx, bob, c.ID)
	wantCode(t, err, api.CodeNotFound)
	_, err = s.Receipts(ctx, bob, c.ID)
	wantCode(t, err, api.CodeNotFound)
	mu.Lock()
	if len(denied) != 5 {
		t.Errorf("denied attempts reported: %v, want 5 of bob", denied)
	}
	mu.Unlock()
	if _, err := os.Stat(filepath.Join(s.cfg.Dir, "computers", c.ID, "root", "work")); !os.IsNotExist(err) {
		t.Errorf("bob's copy in wrote: %v", err)
	}
	if _, err := s.CopyIn(ctx, alice, c.ID, "/work", bytes.NewReader(stream)); err != nil {
		t.Errorf("positive control: alice's copy in: %v", err)
	}
	if _, err := s.TouchAs(ctx, alice, c.ID); err != nil {
		t.Errorf("positive control: alice's touch: %v", err)
	}
}
