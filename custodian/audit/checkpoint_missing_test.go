package audit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenRefusesLogWithoutCheckpoint attacks the log by deleting its
// checkpoint, alone and after editing a record: Open must refuse both
// rather than accept the log and sign it again. A fresh log carries a
// size-0 checkpoint before its first record, and an empty log whose
// creation crashed before that checkpoint is still accepted.
func TestOpenRefusesLogWithoutCheckpoint(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	opts := Options{Signer: k.s, Verifier: k.v}
	dir := writeLog(t, k, 5)
	ls := lines(t, dir)
	ls[2] = bytes.Replace(ls[2], []byte(`"content":2`), []byte(`"content":9`), 1)
	writeLines(t, dir, ls)
	if err := os.Remove(filepath.Join(dir, CheckpointFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, opts); !errors.Is(err, ErrTampered) {
		t.Fatalf("Open over an edited log without its checkpoint: %v, want ErrTampered", err)
	}
	if _, err := os.Stat(filepath.Join(dir, CheckpointFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused Open wrote a checkpoint (%v)", err)
	}
	// Only a torn first line and no checkpoint: bytes were written, refuse.
	writeLines(t, dir, [][]byte{[]byte(`{"seq":0,"kind":"disp`)})
	if _, err := Open(dir, opts); !errors.Is(err, ErrTampered) {
		t.Fatalf("Open over a torn log without its checkpoint: %v, want ErrTampered", err)
	}

	fresh := filepath.Join(t.TempDir(), "audit")
	l := openLog(t, fresh, k)
	if rep, err := Verify(fresh, k.v, nil); err != nil || rep.Signed != 0 || rep.Records != 0 {
		t.Fatalf("a fresh log before any record: %+v %v; want a size-0 checkpoint", rep, err)
	}
	ck0, err := os.ReadFile(filepath.Join(fresh, CheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	l.Append(rec(0))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(fresh, k.v, ck0); err != nil {
		t.Fatalf("the size-0 checkpoint as an external one: %v", err)
	}

	crashed := filepath.Join(t.TempDir(), "audit")
	if err := os.Mkdir(crashed, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(crashed, LogFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, crashed, k)
	l.Append(rec(0))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(crashed, k.v, nil); err != nil || rep.Signed != 1 {
		t.Fatalf("a log whose creation crashed before its checkpoint: %+v %v", rep, err)
	}
}
