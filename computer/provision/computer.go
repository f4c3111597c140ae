// Package provision makes and ends computers: an allocation (a fresh
// unprivileged uid and gid, a root directory), a CA with receiver and
// custodian certificates, an admission signing key (the coordinator's), a
// published admission file granting the allocation's tuple, and a real
// tether-receiver serving mutual TLS: on a namespaced computer (the
// default) as PID 1 of its own namespaces over a unix socket in the
// computer's directory, and on loopback TCP only with IsolationOff, the
// benchmarks' baseline. Close tears all of it down and proves nothing is
// left: no process, no directory, no file.
//
// Local is the kind that runs the receiver as a root process on this
// machine; NewProvisioner serves it to the computer service
// (computer/api.Provisioner). Tests reach it through fixtures/computer,
// which wraps it behind the Computer interface it shares with the QEMU
// kind (fixtures/vmcomputer).
package provision

import (
	"errors"
	"io/fs"
)

// FileInfo is what the computer's kernel says about one path.
type FileInfo struct {
	Name string
	Mode fs.FileMode // type and permission bits
	UID  uint32
	GID  uint32
	Size int64
}

// Process is one process. From Computer.Processes, PID and PPID are as
// the computer sees them (in a namespaced computer's own PID namespace,
// as the receiver reports them); from AllProcesses and ProcessesOf, as
// this process sees them. HostPID is always the pid in this process's
// namespace, to signal it; NSPID the pid in the process's own innermost
// PID namespace.
type Process struct {
	PID     int
	PPID    int
	UID     uint32
	Comm    string
	Cmdline []string
	HostPID int
	NSPID   int
}

// Errors callers branch on.
var (
	// ErrReceiverExited: the receiver process ended (or refused to start).
	// It is wrapped by *ExitError, which carries the receiver's log.
	ErrReceiverExited = errors.New("computer: receiver exited")
	// ErrLeftover: Close found processes, files or directories that
	// should have been gone; they were removed, and the error names them.
	ErrLeftover = errors.New("computer: leftover after teardown")
	// ErrOptions: the options cannot make a safe computer; the message
	// names the check.
	ErrOptions = errors.New("computer: options")
	// ErrNotComputer: a directory is not a computer made by this package
	// (Attach, Down), so nothing in it is touched.
	ErrNotComputer = errors.New("computer: not a tether computer directory")
)

// ExitError reports a receiver that ended: its exit status and the tail of
// its log, which names the failed check (for example a missing capability).
type ExitError struct {
	Status string // e.g. "exit status 1"
	Log    string // the receiver's stderr (tail)
}

// Error names the exit status and carries the receiver's log tail.
func (e *ExitError) Error() string {
	return "computer: receiver exited (" + e.Status + "): " + e.Log
}

// Unwrap makes errors.Is(err, ErrReceiverExited) hold.
func (e *ExitError) Unwrap() error { return ErrReceiverExited }
