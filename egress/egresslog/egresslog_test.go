package egresslog

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeLog appends n records to a new log and returns its path, lines and head.
func writeLog(t *testing.T, n int) (string, [][]byte, Head) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "egress.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := l.Append(Record{Time: time.Unix(1700000000, int64(i)).UTC(), Computer: "c1", Proto: "connect",
			Host: "pypi.org", Port: 443, Addr: "151.101.0.223", Rule: "allow host pypi.org", Verdict: Allowed,
			Up: int64(i), Down: 100, Micros: 5}); err != nil {
			t.Fatal(err)
		}
	}
	head := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, bytes.SplitAfter(b, []byte("\n"))[:n], head
}

func verifyBytes(lines [][]byte) (Head, error) {
	return VerifyReader(bytes.NewReader(bytes.Join(lines, nil)))
}

// TestVerifyFindsTampering: the untouched log verifies to the writer's
// head (the positive control); an edit, a deletion, an insertion, a
// reorder and a torn line each fail, and an edit of the last record
// shows against the head.
func TestVerifyFindsTampering(t *testing.T) {
	path, lines, head := writeLog(t, 5)
	got, err := Verify(path)
	if err != nil || got != head || got.Records != 5 {
		t.Fatalf("Verify = %+v, %v; want %+v", got, err, head)
	}
	edit := func(i int, old, new string) [][]byte {
		out := append([][]byte(nil), lines...)
		out[i] = bytes.Replace(lines[i], []byte(old), []byte(new), 1)
		return out
	}
	tampered := map[string][][]byte{
		"edit bytes":  edit(2, `"bytes_down":100`, `"bytes_down":101`),
		"edit space":  edit(2, `"seq":2,`, `"seq": 2,`),
		"delete":      append(append([][]byte(nil), lines[:2]...), lines[3:]...),
		"delete head": lines[1:],
		"duplicate":   append(append([][]byte(nil), lines[:3]...), lines[2:]...),
		"reorder":     {lines[0], lines[2], lines[1], lines[3], lines[4]},
		"torn":        {lines[0], lines[1][:len(lines[1])-1]},
		"unknown key": edit(1, `"seq":1,`, `"seq":1,"x":1,`),
	}
	for name, ls := range tampered {
		if _, err := verifyBytes(ls); !errors.Is(err, ErrBroken) {
			t.Errorf("%s: Verify = %v, want ErrBroken", name, err)
		}
	}
	last, err := verifyBytes(edit(4, `"bytes_down":100`, `"bytes_down":999`))
	if err != nil || last == head {
		t.Errorf("an edit of the last record: %+v, %v; want a head that differs from %+v", last, err, head)
	}
}

// TestOpenContinuesTheChain: a reopened log appends after its head, and
// a log that does not verify is not opened.
func TestOpenContinuesTheChain(t *testing.T) {
	path, lines, _ := writeLog(t, 2)
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.Append(Record{Computer: "c2", Verdict: Refused})
	l.Close()
	if err != nil || r.Seq != 2 {
		t.Fatalf("Append after reopen: seq %d, %v", r.Seq, err)
	}
	if h, err := Verify(path); err != nil || h.Records != 3 {
		t.Fatalf("Verify after reopen: %+v, %v", h, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.log")
	os.WriteFile(bad, append([]byte(nil), lines[1]...), 0o600)
	if _, err := Open(bad); !errors.Is(err, ErrBroken) {
		t.Fatalf("Open of a broken log: %v", err)
	}
}

// FuzzVerify: VerifyReader never panics; what verifies verifies again to
// the same head, and every record line it accepted is canonical.
func FuzzVerify(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte(`{"seq":0,"time":"2023-11-14T22:13:20Z","computer":"c","proto":"http","verdict":"allowed","bytes_up":0,"bytes_down":0,"duration_us":0,"prev":"` + Genesis + "\"}\n"))
	f.Add([]byte("{\"seq\":0}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := VerifyReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		h2, err := VerifyReader(strings.NewReader(string(b)))
		if err != nil || h2 != h || h.Records != uint64(bytes.Count(b, []byte("\n"))) {
			t.Fatalf("verified %+v, then %+v, %v", h, h2, err)
		}
	})
}

// TestAppendRefusesOverlongRecord: a record whose line would pass
// MaxLine is not written, and the log still verifies and continues. The
// positive control writes the same record's line by hand: Verify then
// refuses the log, so Open would keep the proxy from starting.
func TestAppendRefusesOverlongRecord(t *testing.T) {
	path, _, head := writeLog(t, 1)
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	long := Record{Computer: "c1", Proto: "connect", Host: strings.Repeat("\x00", MaxLine/4), Verdict: Refused}
	if _, err := l.Append(long); !errors.Is(err, ErrTooLong) {
		t.Errorf("Append of a %d-byte host: %v, want ErrTooLong", len(long.Host), err)
	}
	if _, err := l.Append(Record{Computer: "c1", Proto: "http", Verdict: Allowed}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if got, err := Verify(path); err != nil || got.Records != 2 {
		t.Fatalf("after the refused append: %+v, %v", got, err)
	}
	long.Seq, long.Prev = head.Records, head.Hash
	line, err := json.Marshal(long)
	if err != nil {
		t.Fatal(err)
	}
	control := filepath.Join(t.TempDir(), "control.log")
	first, _ := os.ReadFile(path)
	firstLine, _, _ := bytes.Cut(first, []byte("\n"))
	os.WriteFile(control, append(append(append(firstLine, '\n'), line...), '\n'), 0o600)
	if _, err := Verify(control); !errors.Is(err, ErrBroken) {
		t.Errorf("positive control: a %d-byte line verified: %v", len(line), err)
	}
}

// TestAppendKeepsInvalidUTF8Verifiable: a host that is not UTF-8 (a
// SOCKS5 name is any bytes) is written with U+FFFD for each run of bad bytes, so the
// log verifies. Positive control: the record marshalled as it came is not
// canonical, and Verify refuses it.
func TestAppendKeepsInvalidUTF8Verifiable(t *testing.T) {
	path, _, head := writeLog(t, 1)
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := Record{Computer: "c1", Proto: "socks5", Host: "a\xff\xfeb", Verdict: Refused, Reason: "x\xc3"}
	got, err := l.Append(bad)
	if err != nil || got.Host != "a\uFFFDb" {
		t.Fatalf("Append: %q, %v", got.Host, err)
	}
	l.Close()
	if h, err := Verify(path); err != nil || h.Records != 2 {
		t.Fatalf("after a non-UTF-8 host: %+v, %v", h, err)
	}
	bad.Seq, bad.Prev = head.Records, head.Hash
	line, _ := json.Marshal(bad)
	first, _ := os.ReadFile(path)
	firstLine, _, _ := bytes.Cut(first, []byte("\n"))
	control := filepath.Join(t.TempDir(), "control.log")
	os.WriteFile(control, append(append(append(firstLine, '\n'), line...), '\n'), 0o600)
	if _, err := Verify(control); !errors.Is(err, ErrBroken) {
		t.Errorf("positive control: the raw record verified: %v", err)
	}
}

// TestVerifyHeadFindsTruncation: against the head the writer kept, a log
// cut by its last record, and one whose last record was edited, fail;
// the untouched log, and the log grown past the head, pass. Positive
// control: Verify alone passes both the cut and the edited log.
func TestVerifyHeadFindsTruncation(t *testing.T) {
	path, lines, head := writeLog(t, 4)
	if _, err := VerifyHead(path, head); err != nil {
		t.Fatalf("the untouched log: %v", err)
	}
	if _, err := VerifyHead(path, Head{Hash: Genesis}); err != nil {
		t.Fatalf("against the empty head: %v", err)
	}
	mid, err := verifyBytes(lines[:2])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyHead(path, mid); err != nil {
		t.Fatalf("the log grown past an earlier head: %v", err)
	}
	edited := append(append([][]byte(nil), lines[:3]...), bytes.Replace(lines[3], []byte(`"bytes_down":100`), []byte(`"bytes_down":7`), 1))
	for name, ls := range map[string][][]byte{"cut": lines[:3], "edited": edited} {
		p := filepath.Join(t.TempDir(), name+".log")
		os.WriteFile(p, bytes.Join(ls, nil), 0o600)
		if _, err := Verify(p); err != nil {
			t.Errorf("positive control: Verify refused the %s log: %v", name, err)
		}
		if _, err := VerifyHead(p, head); !errors.Is(err, ErrBroken) {
			t.Errorf("the %s log against the kept head: %v, want ErrBroken", name, err)
		}
	}
}
