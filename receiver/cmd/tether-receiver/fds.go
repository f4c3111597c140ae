package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// markInheritedCloexec marks every descriptor >= 3 close-on-exec, so
// nothing the daemon inherited without that flag (a launching shell's
// pipe, a supervisor's socket) reaches a command. It runs before the
// daemon opens anything; descriptors it opens later are close-on-exec
// already. close_range(2) with CLOSE_RANGE_CLOEXEC (Linux >= 5.11) does it
// in one call; where that is missing (ENOSYS, EINVAL) every descriptor
// listed in /proc/self/fd is marked one by one.
func markInheritedCloexec() error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("check inherited descriptors are close-on-exec: close_range: %w", err)
	}
	return markCloexecFromProc()
}

// markCloexecFromProc marks every descriptor >= 3 in /proc/self/fd
// close-on-exec (the listing's own descriptor included; it is closed).
func markCloexecFromProc() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("check inherited descriptors are close-on-exec: list /proc/self/fd: %w", err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if errors.Is(err, unix.EBADF) { // the listing's own descriptor, closed since
			continue
		}
		if err == nil {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC)
		}
		if err != nil {
			return fmt.Errorf("check inherited descriptors are close-on-exec: fd %d: %w", fd, err)
		}
	}
	return nil
}
