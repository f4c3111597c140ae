package opstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func frames(t testing.TB, ins ...Intent) []byte {
	var buf []byte
	for i := range ins {
		var err error
		if buf, err = appendFrame(buf, &ins[i]); err != nil {
			t.Fatal(err)
		}
	}
	return buf
}

func TestScanSegmentTornTail(t *testing.T) {
	a, b := intent("a", "1"), intent("b", "2")
	full := frames(t, a, b)
	one := len(frames(t, a))
	for cut := one; cut < len(full); cut++ {
		ins, valid, err := ScanSegment(full[:cut])
		if err != nil || len(ins) != 1 || valid != one {
			t.Fatalf("cut at %d: %d intents, valid %d, err %v; want 1, %d, nil", cut, len(ins), valid, err, one)
		}
	}
	zeroed := append(append([]byte{}, full...), make([]byte, 4096)...)
	if ins, _, err := ScanSegment(zeroed); err != nil || len(ins) != 2 {
		t.Fatalf("zero-filled tail: %d intents, %v", len(ins), err)
	}
	flipped := append([]byte{}, full...)
	flipped[len(flipped)-3] ^= 0xff // damage the last record only: torn
	if ins, _, err := ScanSegment(flipped); err != nil || len(ins) != 1 {
		t.Fatalf("damaged last record: %d intents, %v; want it dropped as torn", len(ins), err)
	}
}

func TestScanSegmentCorruptionInTheMiddle(t *testing.T) {
	full := frames(t, intent("a", "1"), intent("b", "2"))
	full[frameHeader+2] ^= 0xff // first record's payload
	if _, _, err := ScanSegment(full); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damage followed by a record: %v, want ErrCorrupt", err)
	}
}

func TestOpenRefusesCorruptLog(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	data := frames(t, intent("a", "1"), intent("b", "2"))
	data[frameHeader+2] ^= 0xff
	os.WriteFile(filepath.Join(dir, segName(7)), data, 0o600)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open over a corrupt segment: %v, want ErrCorrupt", err)
	}
}

func TestSegmentsRotateAndAreReleased(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentBytes: 2048})
	ctx := context.Background()
	for i := range 200 {
		tk, _, err := s.Begin(ctx, intent("r"+string(rune('a'+i%26))+string(rune('a'+i/26)), "x"))
		if err != nil {
			t.Fatal(err)
		}
		finishOK(t, tk, `{}`)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	s.log.mu.Lock()
	rotated := s.log.cur.id > 2
	s.log.mu.Unlock()
	if !rotated {
		t.Fatal("200 intents in 2 KiB segments never rotated")
	}
	ids, _ := listSegments(dir)
	if len(ids) > 3 {
		t.Fatalf("%d segments left after every intent was committed; sealed ones must be deleted", len(ids))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if ids, _ := listSegments(dir); len(ids) != 0 {
		t.Fatalf("segments %v left after a clean Close", ids)
	}
}

func FuzzScanSegment(f *testing.F) {
	f.Add(frames(f, intent("a", "1"), intent("b", "2")))
	f.Add([]byte{0, 0, 0, 5, 1, 2, 3, 4, '{', '}'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ins, valid, err := ScanSegment(data)
		if valid < 0 || valid > len(data) {
			t.Fatalf("valid %d outside [0, %d]", valid, len(data))
		}
		if err == nil {
			again, v2, err2 := ScanSegment(data[:valid])
			if err2 != nil || v2 != valid || len(again) != len(ins) {
				t.Fatalf("rescanning the valid prefix changed the result")
			}
		}
		for _, in := range ins {
			if in.validate() != nil {
				t.Fatalf("accepted an invalid intent %+v", in)
			}
		}
	})
}
