package auditlog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/qmpinput/statedir"
)

func newLog(t *testing.T) (*Log, *statedir.Dir, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "state")
	d, err := statedir.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return New(d, nil), d, filepath.Join(p, FileName)
}

func fill(t *testing.T, l *Log) {
	t.Helper()
	for _, r := range []Record{
		{Kind: KindTokenMint, Actor: "operator", Role: "control", Token: "0123456789abcdef", TTLMillis: 3600000},
		{Kind: KindHandoverBegin, Actor: "alice (token 0123456789abcdef)", Role: "control", Scope: "input+capture display=video0/0", TTLMillis: 900000},
		{Kind: KindPause, Actor: "alice (token 0123456789abcdef)", Role: "control", Scope: "vm"},
		{Kind: KindResume, Actor: "alice (token 0123456789abcdef)", Role: "control", Scope: "vm", DurMillis: 1500},
		{Kind: KindHandoverEnd, Actor: "alice (token 0123456789abcdef)", Role: "control", DurMillis: 4000, Reason: "explicit"},
		{Kind: KindTokenRevoke, Actor: "operator", Token: "0123456789abcdef"},
	} {
		if _, err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAppendVerify(t *testing.T) {
	l, d, _ := newLog(t)
	fill(t, l)
	s, err := VerifyDir(d, nil)
	if err != nil || s.Entries != 6 || s.Kinds[KindHandoverBegin] != 1 || s.Head == Genesis {
		t.Fatalf("%+v %v", s, err)
	}
	recs, err := Read(d)
	if err != nil || len(recs) != 6 || recs[0].Prev != Genesis || recs[5].Seq != 6 {
		t.Fatalf("%+v %v", recs, err)
	}
	if _, err := VerifyDir(d, map[int]string{6: s.Head}); err != nil {
		t.Fatalf("own head as checkpoint: %v", err)
	}
}

// TestVerifyDetectsTampering: an edited, removed, reordered or inserted
// line, a line with an extra (content) field, a partial last line and a
// rewrite before a checkpoint all fail.
func TestVerifyDetectsTampering(t *testing.T) {
	l, _, path := newLog(t)
	fill(t, l)
	orig, _ := os.ReadFile(path)
	lines := strings.SplitAfter(strings.TrimSuffix(string(orig), "\n"), "\n")
	lines[len(lines)-1] += "\n"
	join := func(ls ...string) []byte { return []byte(strings.Join(ls, "")) }
	head, _ := Verify(bytes.NewReader(orig), nil)
	for name, b := range map[string][]byte{
		"edited actor":      bytes.Replace(orig, []byte(`"alice`), []byte(`"mallory`), 1),
		"removed line":      join(append(append([]string{}, lines[:2]...), lines[3:]...)...),
		"swapped lines":     join(lines[0], lines[2], lines[1], lines[3], lines[4], lines[5]),
		"keystrokes added":  bytes.Replace(orig, []byte(`"kind":"handover_end"`), []byte(`"kind":"handover_end","keys":"hunter2"`), 1),
		"partial last line": orig[:len(orig)-5],
		"unknown kind":      bytes.Replace(orig, []byte(`"kind":"pause"`), []byte(`"kind":"exec"`), 1),
	} {
		if _, err := Verify(bytes.NewReader(b), nil); !errors.Is(err, ErrChain) {
			t.Errorf("%s: %v, want ErrChain", name, err)
		}
	}
	// A log rebuilt from scratch is a valid chain, but not the one a
	// checkpoint recorded.
	l2, _, path2 := newLog(t)
	fill(t, l2)
	rebuilt, _ := os.ReadFile(path2)
	if _, err := Verify(bytes.NewReader(rebuilt), map[int]string{6: head.Head}); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("rebuilt log against the old head: %v", err)
	}
	if _, err := Verify(bytes.NewReader(join(lines[:3]...)), map[int]string{6: head.Head}); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("truncated log against a later checkpoint: %v", err)
	}
}

// TestAppendRefusesAfterDamageAndBadRecords: no append extends a
// damaged chain, and records outside the schema are refused.
func TestAppendRefusesAfterDamageAndBadRecords(t *testing.T) {
	l, _, path := newLog(t)
	fill(t, l)
	for _, r := range []Record{{Kind: "keystroke", Actor: "x"}, {Kind: KindPause}, {Kind: KindPause, Actor: "a\nb"},
		{Kind: KindPause, Actor: "x", DurMillis: -1}, {Kind: KindPause, Actor: strings.Repeat("x", 300)}} {
		if _, err := l.Append(r); !errors.Is(err, ErrRecord) {
			t.Errorf("append %+v: %v", r, err)
		}
	}
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte(`{"seq":7`))
	f.Close()
	if _, err := l.Append(Record{Kind: KindPause, Actor: "x"}); !errors.Is(err, ErrChain) {
		t.Fatalf("append after a partial line: %v", err)
	}
}

// TestConcurrentAppendsChain: appends from many writers at once form
// one unbroken chain.
func TestConcurrentAppendsChain(t *testing.T) {
	_, d, _ := newLog(t)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := New(d, nil).Append(Record{Kind: KindPause, Actor: "writer", DurMillis: int64(i), Time: time.Now()}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if s, err := VerifyDir(d, nil); err != nil || s.Entries != 20 {
		t.Fatalf("%+v %v", s, err)
	}
}
