package main

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestMarkCloexecFromProc: the fallback for kernels without close_range
// CLOSE_RANGE_CLOEXEC marks an inherited descriptor that lacks the flag
// and leaves 0-2 alone.
func TestMarkCloexecFromProc(t *testing.T) {
	fd, err := unix.Open("/dev/null", unix.O_RDONLY, 0) // no O_CLOEXEC: as inherited
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	std, err := unix.FcntlInt(0, unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC != 0 {
		t.Fatal("the descriptor is close-on-exec before the test")
	}
	if err := markCloexecFromProc(); err != nil {
		t.Fatal(err)
	}
	if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("fd %d flags %#x, %v: not marked close-on-exec", fd, flags, err)
	}
	if flags, _ := unix.FcntlInt(0, unix.F_GETFD, 0); flags != std {
		t.Fatalf("stdin flags changed from %#x to %#x", std, flags)
	}
}
