package lifecycle

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// writeLog appends a short history of two computers and returns the path.
func writeLog(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "transitions.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	at := time.Date(2026, 12, 6, 19, 0, 0, 0, time.UTC)
	steps := []struct{ id, from, to string }{
		{"a", None, api.StateQueued}, {"a", api.StateQueued, api.StateCreating},
		{"b", None, api.StateQueued}, {"a", api.StateCreating, api.StateRunning},
		{"b", api.StateQueued, api.StateDeleted}, {"a", api.StateRunning, api.StateExpiring},
		{"a", api.StateExpiring, api.StateDeleted},
	}
	for i, s := range steps {
		if _, err := l.Append(Record{Computer: s.id, Owner: "alice", From: s.from, To: s.to,
			At: at.Add(time.Duration(i) * time.Second), Reason: "step"}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	return path
}

func lines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ls := bytes.SplitAfter(b, []byte("\n"))
	return ls[:len(ls)-1] // the empty element after the last newline
}

func rewrite(t *testing.T, path string, ls [][]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(ls, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestUntouchedLogVerifies(t *testing.T) {
	path := writeLog(t)
	n, err := Verify(path)
	if err != nil || n != 7 {
		t.Fatalf("Verify = %d, %v; want 7, nil", n, err)
	}
	// Reopening continues the chain.
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.Append(Record{Computer: "b2", Owner: "bob", From: None, To: api.StateQueued, At: time.Now()})
	l.Close()
	if err != nil || r.Seq != 8 {
		t.Fatalf("append after reopen: %+v, %v", r, err)
	}
	if n, err := Verify(path); err != nil || n != 8 {
		t.Fatalf("Verify after reopen = %d, %v", n, err)
	}
}

// wantBroken checks that Verify names line and the failed check.
func wantBroken(t *testing.T, path string, line int, check error) {
	t.Helper()
	_, err := Verify(path)
	var be *BrokenError
	if !errors.As(err, &be) {
		t.Fatalf("Verify = %v, want a BrokenError", err)
	}
	if be.Line != line || !errors.Is(err, check) {
		t.Fatalf("Verify = %v, want line %d and %v", err, line, check)
	}
	if _, err := Open(path); err == nil {
		t.Fatal("Open accepted a broken log")
	}
}

func TestFlippedByteFound(t *testing.T) {
	path := writeLog(t)
	ls := lines(t, path)
	// Flip one byte of the reason of record 4 ("step" → "stop").
	ls[3] = bytes.Replace(ls[3], []byte(`"reason":"step"`), []byte(`"reason":"stop"`), 1)
	rewrite(t, path, ls)
	wantBroken(t, path, 4, ErrHash)
}

func TestFlippedByteInEveryPositionFound(t *testing.T) {
	path := writeLog(t)
	orig, _ := os.ReadFile(path)
	for i := range orig {
		if orig[i] == '\n' {
			continue
		}
		b := bytes.Clone(orig)
		b[i] ^= 0x01
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Verify(path); err == nil {
			t.Fatalf("byte %d flipped (%q → %q): Verify passed", i, orig[i], b[i])
		}
	}
}

func TestRemovedRecordFound(t *testing.T) {
	path := writeLog(t)
	ls := lines(t, path)
	rewrite(t, path, append(ls[:2:2], ls[3:]...))
	wantBroken(t, path, 3, ErrSeq)
}

func TestReorderedRecordFound(t *testing.T) {
	path := writeLog(t)
	ls := lines(t, path)
	ls[2], ls[3] = ls[3], ls[2]
	rewrite(t, path, ls)
	wantBroken(t, path, 3, ErrSeq)
}

// TestRechainedForgeryFound: a forger who edits a record and recomputes
// its hash breaks the next record's prev link.
func TestRechainedForgeryFound(t *testing.T) {
	path := writeLog(t)
	ls := lines(t, path)
	r, err := ParseRecord(bytes.TrimSuffix(ls[1], []byte("\n")))
	if err != nil {
		t.Fatal(err)
	}
	r.Reason = "forged"
	r.Hash = r.Sum()
	b, _ := jsonLine(r)
	ls[1] = b
	rewrite(t, path, ls)
	wantBroken(t, path, 3, ErrPrev)
}

func TestIllegalTransitionInLogFound(t *testing.T) {
	path := writeLog(t)
	ls := lines(t, path)
	last, _ := ParseRecord(bytes.TrimSuffix(ls[len(ls)-1], []byte("\n")))
	r := Record{Seq: last.Seq + 1, Computer: "a", Owner: "alice", From: api.StateDeleted,
		To: api.StateRunning, At: last.At, Prev: last.Hash}
	r.Hash = r.Sum()
	b, _ := jsonLine(r)
	rewrite(t, path, append(ls, b))
	wantBroken(t, path, 8, ErrIllegal)
}

func TestTornTailCutOnOpen(t *testing.T) {
	path := writeLog(t)
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":8,"computer":"a"`)
	f.Close()
	wantBrokenVerify(t, path, 8, ErrTorn)
	l, err := Open(path)
	if err != nil {
		t.Fatalf("Open with a torn tail: %v", err)
	}
	if !l.Repaired {
		t.Error("Repaired not set")
	}
	l.Close()
	if n, err := Verify(path); err != nil || n != 7 {
		t.Fatalf("after repair Verify = %d, %v", n, err)
	}
}

func wantBrokenVerify(t *testing.T, path string, line int, check error) {
	t.Helper()
	_, err := Verify(path)
	var be *BrokenError
	if !errors.As(err, &be) || be.Line != line || !errors.Is(err, check) {
		t.Fatalf("Verify = %v, want line %d and %v", err, line, check)
	}
}

func TestAppendRefusesIllegal(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.Append(Record{Computer: "x", Owner: "o", From: None, To: api.StateRunning, At: time.Now()})
	if !errors.Is(err, ErrIllegal) {
		t.Fatalf("append none → running: %v, want ErrIllegal", err)
	}
	if _, err := l.Append(Record{Computer: "x", Owner: "o", From: None, To: api.StateQueued, At: time.Now()}); err != nil {
		t.Fatalf("legal append refused: %v", err)
	}
	_, err = l.Append(Record{Computer: "x", Owner: "o", From: api.StateRunning, To: api.StateSuspended, At: time.Now()})
	if !errors.Is(err, ErrStateOf) {
		t.Fatalf("append from a state the computer is not in: %v, want ErrStateOf", err)
	}
}
