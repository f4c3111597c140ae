// Package caps checks and narrows the receiver's own capabilities. The
// receiver runs as uid 0 with exactly seven capabilities (Required): Check
// proves they are present in the effective, permitted and bounding sets of
// the calling thread, and Narrow drops every other capability from every
// thread of the process. Status parses /proc/<pid>/status so tests and
// start-up can assert masks exactly.
package caps

import (
	"errors"
	"fmt"
	"runtime"
	"strings"

	"github.com/syndtr/gocapability/capability"
	"golang.org/x/sys/unix"
)

// Required lists the seven capabilities the receiver keeps, in the order
// they are reported: CHOWN and FOWNER (files end up owned by the grant's
// uid with an exact mode), DAC_OVERRIDE (work beneath any grant root),
// KILL (signal children that run as another uid), SETGID and SETUID
// (children run as the grant's ids), SETPCAP (empty a spawning thread's
// bounding set).
var Required = []capability.Cap{
	capability.CAP_CHOWN,
	capability.CAP_DAC_OVERRIDE,
	capability.CAP_FOWNER,
	capability.CAP_KILL,
	capability.CAP_SETGID,
	capability.CAP_SETUID,
	capability.CAP_SETPCAP,
}

// RequiredMask is Required as a capability bit mask (bits 0, 1, 3, 5, 6, 7
// and 8), the exact value the receiver's CapEff, CapPrm and CapBnd show
// after Narrow.
const RequiredMask uint64 = 1<<capability.CAP_CHOWN | 1<<capability.CAP_DAC_OVERRIDE |
	1<<capability.CAP_FOWNER | 1<<capability.CAP_KILL | 1<<capability.CAP_SETGID |
	1<<capability.CAP_SETUID | 1<<capability.CAP_SETPCAP

// Name returns the upper-case name of c without its CAP_ prefix ("KILL").
func Name(c capability.Cap) string { return strings.ToUpper(c.String()) }

// The capability sets Check reads, by their /proc names' meaning.
const (
	SetEffective = "effective"
	SetPermitted = "permitted"
	SetBounding  = "bounding"
)

var (
	// ErrNotRoot is wrapped when the process does not run as uid 0.
	ErrNotRoot = errors.New("receiver must run as uid 0")
	// ErrMissing is wrapped by *MissingError: a required capability is
	// absent from one of the checked sets.
	ErrMissing = errors.New("required capability missing")
)

// Missing names one required capability and the sets it is absent from.
type Missing struct {
	Cap  string   // "KILL"
	Sets []string // a subset of effective, permitted, bounding
}

// MissingError lists every required capability that Check found absent.
// errors.Is(err, ErrMissing) holds for it.
type MissingError struct {
	TID     int // the thread that was checked
	Missing []Missing
}

func (e *MissingError) Error() string {
	parts := make([]string, len(e.Missing))
	for i, m := range e.Missing {
		parts[i] = fmt.Sprintf("%s (not in %s)", m.Cap, strings.Join(m.Sets, ", "))
	}
	return fmt.Sprintf("%v on thread %d: %s", ErrMissing, e.TID, strings.Join(parts, "; "))
}

// Unwrap makes errors.Is(err, ErrMissing) hold.
func (e *MissingError) Unwrap() error { return ErrMissing }

// Names returns the names of the missing capabilities.
func (e *MissingError) Names() []string {
	out := make([]string, len(e.Missing))
	for i, m := range e.Missing {
		out[i] = m.Cap
	}
	return out
}

// Check verifies that the process runs as uid 0 (real, effective and
// saved) and that every Required capability is in the effective, permitted
// and bounding sets of the calling OS thread, read by thread id: a thread
// can differ from the process. It returns nil, an error wrapping
// ErrNotRoot, or a *MissingError naming every missing capability.
func Check() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread() // reading does not taint the thread
	return CheckTID(unix.Gettid())
}

// CheckTID is Check for the thread tid of this process.
func CheckTID(tid int) error {
	ruid, euid, suid := unix.Getresuid()
	if ruid != 0 || euid != 0 || suid != 0 {
		return fmt.Errorf("%w: uids are real %d, effective %d, saved %d", ErrNotRoot, ruid, euid, suid)
	}
	c, err := capability.NewPid2(tid)
	if err != nil {
		return fmt.Errorf("read capabilities of thread %d: %w", tid, err)
	}
	if err := c.Load(); err != nil {
		return fmt.Errorf("read capabilities of thread %d: %w", tid, err)
	}
	var missing []Missing
	for _, rc := range Required {
		var sets []string
		for _, s := range []struct {
			t    capability.CapType
			name string
		}{{capability.EFFECTIVE, SetEffective}, {capability.PERMITTED, SetPermitted}, {capability.BOUNDING, SetBounding}} {
			if !c.Get(s.t, rc) {
				sets = append(sets, s.name)
			}
		}
		if len(sets) > 0 {
			missing = append(missing, Missing{Cap: Name(rc), Sets: sets})
		}
	}
	if len(missing) > 0 {
		return &MissingError{TID: tid, Missing: missing}
	}
	return nil
}
