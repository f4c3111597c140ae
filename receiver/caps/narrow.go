package caps

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/syndtr/gocapability/capability"
	"golang.org/x/sys/unix"
)

// ErrAllThreads is wrapped when the process-wide drop cannot reach every
// thread: syscall.AllThreadsSyscall works only in binaries built with
// CGO_ENABLED=0, as the receiver binary is.
var ErrAllThreads = errors.New("cannot change capabilities on every thread (build with CGO_ENABLED=0)")

// ErrThreadState is wrapped by *ThreadError.
var ErrThreadState = errors.New("thread privileges differ from the receiver's")

// ThreadError names the first thread whose privileges are not exactly the
// receiver's: CapEff=CapPrm=CapBnd=RequiredMask, CapInh=CapAmb=0 and
// NoNewPrivs 0.
type ThreadError struct {
	TID   int
	Field string // "CapEff", "NoNewPrivs", ...
	Got   uint64
	Want  uint64
}

func (e *ThreadError) Error() string {
	return fmt.Sprintf("%v: thread %d has %s %016x, want %016x", ErrThreadState, e.TID, e.Field, e.Got, e.Want)
}

// Unwrap makes errors.Is(err, ErrThreadState) hold.
func (e *ThreadError) Unwrap() error { return ErrThreadState }

// Narrow drops every capability but Required from the bounding, ambient,
// inheritable, permitted and effective sets of every thread of the
// process, then verifies each thread with VerifyThreads. Call it once at
// start-up, after Check. It changes the whole process irreversibly.
func Narrow() error {
	for c := capability.Cap(0); c <= capability.CAP_LAST_CAP; c++ {
		if RequiredMask&(1<<uint(c)) != 0 {
			continue
		}
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
			return fmt.Errorf("drop %s from the bounding set: %w", Name(c), err)
		}
	}
	if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil {
		return fmt.Errorf("clear the ambient set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	data[0].Effective = uint32(RequiredMask)
	data[0].Permitted = uint32(RequiredMask)
	data[1].Effective = uint32(RequiredMask >> 32)
	data[1].Permitted = uint32(RequiredMask >> 32)
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("capset effective=permitted=%016x inheritable=0: %w", RequiredMask, err)
	}
	return VerifyThreads()
}

// allThreads runs one syscall on every OS thread of the Go runtime. Like
// syscall.AllThreadsSyscall it is marked uintptrescapes, so a pointer
// converted to uintptr in its call stays valid for the whole call.
//
//go:uintptrescapes
func allThreads(trap, a1, a2, a3 uintptr) error {
	_, _, errno := syscall.AllThreadsSyscall(trap, a1, a2, a3)
	switch {
	case errno == syscall.ENOTSUP:
		return ErrAllThreads
	case errno == syscall.EINVAL && trap == unix.SYS_PRCTL && a1 == unix.PR_CAPBSET_DROP:
		return nil // the kernel does not know this capability
	case errno != 0:
		return errno
	}
	return nil
}

// VerifyThreads reads /proc/self/task/*/status and returns a *ThreadError
// for the first thread whose CapEff, CapPrm or CapBnd is not exactly
// RequiredMask, whose CapInh or CapAmb is not zero, or whose NoNewPrivs is
// set: after a spawn, no receiver thread may keep a child's restrictions.
func VerifyThreads() error {
	sts, err := ThreadStatuses(0)
	if err != nil {
		return fmt.Errorf("read thread statuses: %w", err)
	}
	for tid, st := range sts {
		if err := verifyThread(tid, st); err != nil {
			return err
		}
	}
	return nil
}

func verifyThread(tid int, st Status) error {
	checks := []struct {
		field     string
		got, want uint64
	}{
		{"CapEff", st.CapEff, RequiredMask},
		{"CapPrm", st.CapPrm, RequiredMask},
		{"CapBnd", st.CapBnd, RequiredMask},
		{"CapInh", st.CapInh, 0},
		{"CapAmb", st.CapAmb, 0},
		{"NoNewPrivs", uint64(st.NoNewPrivs), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			return &ThreadError{TID: tid, Field: c.field, Got: c.got, Want: c.want}
		}
	}
	return nil
}
