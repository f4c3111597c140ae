package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
)

type keys struct {
	s note.Signer
	v note.Verifier
}

func newKeys(t testing.TB, name string) keys {
	t.Helper()
	skey, _, err := GenerateKey(name)
	if err != nil {
		t.Fatal(err)
	}
	s, v, err := LoadSigner([]byte(skey))
	if err != nil {
		t.Fatal(err)
	}
	return keys{s, v}
}

func openLog(t testing.TB, dir string, k keys) *Log {
	t.Helper()
	l, err := Open(dir, Options{Signer: k.s, Verifier: k.v})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

func rec(i int) Record {
	return Record{Kind: KindDispatch, SessionID: "s1", OpKey: fmt.Sprintf("k%d", i),
		Digests: map[string]string{"content": strings.Repeat("ab", 32)}, Sizes: map[string]int64{"content": int64(i)}}
}

// writeLog makes a closed log of n records and returns its dir.
func writeLog(t *testing.T, k keys, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "audit")
	l := openLog(t, dir, k)
	for i := range n {
		if _, err := l.Append(rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func lines(t *testing.T, dir string) [][]byte {
	data, err := os.ReadFile(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(data, []byte("\n"))[:bytes.Count(data, []byte("\n"))]
}

func writeLines(t *testing.T, dir string, ls [][]byte) {
	if err := os.WriteFile(filepath.Join(dir, LogFile), bytes.Join(ls, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyClean(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := writeLog(t, k, 25)
	rep, err := Verify(dir, k.v, nil)
	if err != nil || rep.Records != 25 || rep.Signed != 25 || rep.Unsigned != 0 {
		t.Fatalf("Verify = %+v, %v; want 25 signed records", rep, err)
	}
}

func TestVerifyDetectsTruncation(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := writeLog(t, k, 10)
	ls := lines(t, dir)
	writeLines(t, dir, ls[:9])
	if _, err := Verify(dir, k.v, nil); !errors.Is(err, ErrTruncated) {
		t.Fatalf("truncated log: %v, want ErrTruncated", err)
	}
}

func TestVerifyDetectsReordering(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := writeLog(t, k, 10)
	ls := lines(t, dir)
	ls[3], ls[4] = ls[4], ls[3]
	writeLines(t, dir, ls)
	if _, err := Verify(dir, k.v, nil); !errors.Is(err, ErrTampered) {
		t.Fatalf("swapped records: %v, want ErrTampered", err)
	}
	// Swap the seq numbers too, so each line looks in place.
	ls[3] = bytes.Replace(ls[3], []byte(`"seq":4`), []byte(`"seq":3`), 1)
	ls[4] = bytes.Replace(ls[4], []byte(`"seq":3`), []byte(`"seq":4`), 1)
	writeLines(t, dir, ls)
	if _, err := Verify(dir, k.v, nil); !errors.Is(err, ErrTampered) {
		t.Fatalf("swapped records with fixed seqs: %v, want ErrTampered", err)
	}
}

func TestVerifyDetectsEditedRecord(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := writeLog(t, k, 10)
	ls := lines(t, dir)
	ls[6] = bytes.Replace(ls[6], []byte(`"content":6`), []byte(`"content":7`), 1)
	writeLines(t, dir, ls)
	if _, err := Verify(dir, k.v, nil); !errors.Is(err, ErrTampered) {
		t.Fatalf("edited record: %v, want ErrTampered", err)
	}
}

func TestVerifyExternalCheckpointCatchesRollback(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := filepath.Join(t.TempDir(), "audit")
	l := openLog(t, dir, k)
	ctx := context.Background()
	var ck3, ck6 []byte
	for i := range 10 {
		l.Append(rec(i))
		var err error
		switch i {
		case 2:
			ck3, err = l.Checkpoint(ctx)
		case 5:
			ck6, err = l.Checkpoint(ctx) // the copy an auditor keeps elsewhere
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	if _, err := Verify(dir, k.v, ck6); err != nil {
		t.Fatalf("consistent external checkpoint refused: %v", err)
	}
	// Attack: cut the log back to 3 records and restore the old checkpoint.
	writeLines(t, dir, lines(t, dir)[:3])
	os.WriteFile(filepath.Join(dir, CheckpointFile), ck3, 0o600)
	if _, err := Verify(dir, k.v, nil); err != nil {
		t.Fatalf("without an external checkpoint the rollback is self-consistent, got %v", err)
	}
	if _, err := Verify(dir, k.v, ck6); !errors.Is(err, ErrTruncated) {
		t.Fatalf("rollback against the external checkpoint: %v, want ErrTruncated", err)
	}
}

func TestVerifyExternalCheckpointCatchesFork(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	a := writeLog(t, k, 8)
	ckA, _ := os.ReadFile(filepath.Join(a, CheckpointFile))
	dir := filepath.Join(t.TempDir(), "audit")
	l := openLog(t, dir, k)
	for i := range 12 {
		r := rec(i)
		if i == 1 {
			r.Code = "rewritten"
		}
		l.Append(r)
	}
	l.Close()
	if _, err := Verify(dir, k.v, ckA); !errors.Is(err, ErrInconsistent) {
		t.Fatalf("fork: %v, want ErrInconsistent", err)
	}
}

func TestVerifyRefusesForeignKey(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := writeLog(t, k, 3)
	other := newKeys(t, "tether.test/audit")
	if _, err := Verify(dir, other.v, nil); !errors.Is(err, ErrSignature) {
		t.Fatalf("foreign key: %v, want ErrSignature", err)
	}
}

func TestOpenRefusesTamperedLog(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := writeLog(t, k, 5)
	ls := lines(t, dir)
	writeLines(t, dir, ls[:4])
	if _, err := Open(dir, Options{Signer: k.s, Verifier: k.v}); !errors.Is(err, ErrTruncated) {
		t.Fatalf("Open over a truncated log: %v, want ErrTruncated", err)
	}
	ls[2] = bytes.Replace(ls[2], []byte(`"content":2`), []byte(`"content":9`), 1)
	writeLines(t, dir, ls)
	if _, err := Open(dir, Options{Signer: k.s, Verifier: k.v}); !errors.Is(err, ErrTampered) {
		t.Fatalf("Open over an edited log: %v, want ErrTampered", err)
	}
}

func TestTornTailIsCutAndLogContinues(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := writeLog(t, k, 4)
	f, _ := os.OpenFile(filepath.Join(dir, LogFile), os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte(`{"seq":4,"kind":"disp`))
	f.Close()
	if rep, err := Verify(dir, k.v, nil); err != nil || rep.TornBytes == 0 {
		t.Fatalf("torn tail: %+v %v; want reported, not fatal", rep, err)
	}
	l := openLog(t, dir, k)
	l.Append(rec(4))
	l.Close()
	if rep, err := Verify(dir, k.v, nil); err != nil || rep.Signed != 5 || rep.TornBytes != 0 {
		t.Fatalf("after reopen: %+v %v", rep, err)
	}
}

func TestConcurrentAppendsKeepOrderAndShareSyncs(t *testing.T) {
	var syncs atomic.Int32
	orig := fdatasync
	fdatasync = func(fd int) error { syncs.Add(1); return orig(fd) }
	t.Cleanup(func() { fdatasync = orig })
	k := newKeys(t, "tether.test/audit")
	dir := filepath.Join(t.TempDir(), "audit")
	l := openLog(t, dir, k)
	const workers, each = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := l.Append(rec(w*each + i)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir, k.v, nil)
	if err != nil || rep.Signed != workers*each {
		t.Fatalf("Verify = %+v, %v", rep, err)
	}
	if n := syncs.Load(); n >= workers*each {
		t.Fatalf("%d records took %d fdatasyncs; group commit should share them", workers*each, n)
	}
	t.Logf("%d records, %d fdatasyncs", workers*each, syncs.Load())
}

func TestPeriodicCheckpoint(t *testing.T) {
	k := newKeys(t, "tether.test/audit")
	dir := filepath.Join(t.TempDir(), "audit")
	l, err := Open(dir, Options{Signer: k.s, Verifier: k.v, CheckpointEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 3 {
		l.Append(rec(i))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if rep, err := Verify(dir, k.v, nil); err == nil && rep.Signed == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no periodic checkpoint covering the appended records")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBrokenLogRefusesAppends(t *testing.T) {
	orig := fdatasync
	fdatasync = func(int) error { return errors.New("EIO") }
	t.Cleanup(func() { fdatasync = orig })
	k := newKeys(t, "tether.test/audit")
	l := openLog(t, filepath.Join(t.TempDir(), "audit"), k)
	l.Append(rec(0))
	if err := l.Sync(context.Background()); !errors.Is(err, ErrBroken) {
		t.Fatalf("Sync after failed fdatasync: %v, want ErrBroken", err)
	}
	if _, err := l.Append(rec(1)); !errors.Is(err, ErrBroken) {
		t.Fatalf("Append on a broken log: %v, want ErrBroken", err)
	}
	if l.Err() == nil {
		t.Fatal("Err() is nil on a broken log")
	}
	l.Close()
}
