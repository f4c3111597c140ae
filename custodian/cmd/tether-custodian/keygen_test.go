package main

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/tetherdev/tether/custodian/internal/durable"
)

// TestKeygenSyncsTheKeyDirectory: a generated audit key must survive a
// crash, so its directory is fsynced after the key files are written.
func TestKeygenSyncsTheKeyDirectory(t *testing.T) {
	dir := t.TempDir()
	syncs, restore := durable.CountSyncs()
	t.Cleanup(restore)
	if code := cmdAuditKeygen([]string{"--name", "tether.test/k", "--out", filepath.Join(dir, "k")}, io.Discard, io.Discard); code != 0 {
		t.Fatalf("keygen exit %d", code)
	}
	if n := len(syncs.Dirs()); n != 2 || !syncs.Has(dir) {
		t.Fatalf("synced %q; want the key directory after each of the two files", syncs.Dirs())
	}
}
