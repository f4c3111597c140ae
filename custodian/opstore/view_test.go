package opstore

import (
	"context"
	"errors"
	"testing"
)

func TestReadOnlyShowsReceiptsAndRefusesWhileLocked(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()
	tk, _, _ := s.Begin(ctx, intent("a", "1"))
	finishOK(t, tk, `{"x":1}`)
	if _, err := ReadOnly(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("ReadOnly while open: %v, want ErrLocked", err)
	}
	s.Close()
	rs, err := ReadOnly(dir)
	if err != nil || len(rs) != 1 || rs[0].OpKey != "a" || rs[0].Outcome != Verified {
		t.Fatalf("ReadOnly = %+v, %v", rs, err)
	}
}

func TestReadOnlyShowsUnrecoveredIntentsAsInterrupted(t *testing.T) {
	dir := t.TempDir()
	killAt(t, dir, "begun")
	rs, err := ReadOnly(dir)
	if err != nil || len(rs) != 1 || rs[0].Outcome != Interrupted {
		t.Fatalf("ReadOnly after crash = %+v, %v; want the key interrupted", rs, err)
	}
	ids, _ := listSegments(dir)
	if len(ids) == 0 {
		t.Fatal("ReadOnly recovered (deleted segments); it must not modify the store")
	}
}
