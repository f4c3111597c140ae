package qmpinput

import (
	"errors"
	"fmt"
	"io/fs"
)

// Sentinel errors callers branch on (errors.Is). Every refusal wraps one.
var (
	// ErrNotUnixSocket: the address is not an absolute path to a unix
	// socket (TCP, abstract sockets, symlinks and other files are refused).
	ErrNotUnixSocket = errors.New("qmp address is not a pinned unix socket path")
	// ErrSocketOwner: the socket file, its directory or the connected peer
	// belongs to another uid than the pinned owner (see *OwnerError).
	ErrSocketOwner = errors.New("qmp socket owner mismatch")
	// ErrSocketMode: the socket or its directory is writable by group or
	// others (a non-sticky directory), so another user could reach QEMU.
	ErrSocketMode = errors.New("qmp socket mode too open")
	// ErrSocketChanged: the socket path named another file after connecting.
	ErrSocketChanged = errors.New("qmp socket replaced while connecting")
	// ErrVersion: the QEMU version in the greeting is outside the pinned
	// range (see *VersionError).
	ErrVersion = errors.New("qemu version outside the pinned range")
	// ErrProtocol: QEMU sent something that is not valid QMP (a malformed
	// greeting or message, an oversize line, a reply to no command).
	ErrProtocol = errors.New("qmp protocol violation")
	// ErrCommandNotAllowed: a command outside the closed set.
	ErrCommandNotAllowed = errors.New("qmp command not allowed")
	// ErrDeadline: QEMU did not answer before the call's deadline; the
	// connection is closed because replies can no longer be paired.
	ErrDeadline = errors.New("qmp call deadline exceeded")
	// ErrActionDeadline: a script action did not finish within its
	// per-action deadline (tether-qmp run --timeout). It wraps ErrDeadline
	// as well when the overrun was a QMP call.
	ErrActionDeadline = errors.New("script action deadline exceeded")
	// ErrClosed: the adapter or its connection is closed.
	ErrClosed = errors.New("qmp adapter closed")
	// ErrCommandFailed: QEMU answered a command with an error (see *QMPError).
	ErrCommandFailed = errors.New("qmp command failed")

	// ErrNoCapture: pointer input (move, click, scroll) before any capture
	// or after a handover dropped it; coordinates have no pixel space.
	ErrNoCapture = errors.New("no capture yet: pointer input needs the pixel space of a capture")
	// ErrOutOfBounds: a pointer coordinate outside the most recent capture.
	ErrOutOfBounds = errors.New("coordinate outside the most recent capture")
	// ErrKeyNotAllowed: a key outside the QKeyCode allowlist, or a denied combo.
	ErrKeyNotAllowed = errors.New("key not allowed")
	// ErrTextNotAllowed: text too long or with a character that has no key.
	ErrTextNotAllowed = errors.New("text not allowed")
	// ErrScrollNotAllowed: a scroll of zero or more than the bound.
	ErrScrollNotAllowed = errors.New("scroll not allowed")

	// ErrPoolFull: the capture pool has no room even after pruning expired
	// captures; no recent capture is ever deleted to make room.
	ErrPoolFull = errors.New("capture pool full")
	// ErrCapture: the screendump file is missing, not a regular private
	// file, too large, or not a PNG.
	ErrCapture = errors.New("capture invalid")

	// ErrFenced: agent input refused because a handover holds input.
	ErrFenced = errors.New("input fenced by handover")
	// ErrMasked: agent capture refused because a handover is active.
	ErrMasked = errors.New("capture masked by handover")
	// ErrHandoverActive: a handover began while another one holds input.
	ErrHandoverActive = errors.New("handover already active")
	// ErrPaused: Pause while the VM is already paused.
	ErrPaused = errors.New("vm already paused")
	// ErrNotPaused: Resume while Pause did not freeze the VM.
	ErrNotPaused = errors.New("vm not paused")

	// ErrUnsupported: exec, files, clipboard and browser operations do not
	// exist in this adapter and never fall through to another backend.
	ErrUnsupported = errors.New("operation unsupported by the visual-only qmp adapter")
	// ErrConfig: an invalid Config.
	ErrConfig = errors.New("qmpinput config")
)

// OwnerError says which file or peer had which owner.
type OwnerError struct {
	What string // "socket", "socket directory" or "peer process"
	Path string
	Want uint32
	Got  uint32
}

func (e *OwnerError) Error() string {
	return fmt.Sprintf("%v: %s %s is owned by uid %d, want uid %d", ErrSocketOwner, e.What, e.Path, e.Got, e.Want)
}

func (e *OwnerError) Unwrap() error { return ErrSocketOwner }

// ModeError says which file had which mode.
type ModeError struct {
	What string
	Path string
	Mode fs.FileMode
}

func (e *ModeError) Error() string {
	return fmt.Sprintf("%v: %s %s has mode %v (group/other may write)", ErrSocketMode, e.What, e.Path, e.Mode)
}

func (e *ModeError) Unwrap() error { return ErrSocketMode }

// VersionError carries the version QEMU announced and the pinned range.
type VersionError struct {
	Got   Version
	Range VersionRange
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("%v: qemu %s, pinned %s", ErrVersion, e.Got, e.Range)
}

func (e *VersionError) Unwrap() error { return ErrVersion }

// QMPError is QEMU's answer to a failed command, with its class kept (go-qemu
// drops it).
type QMPError struct {
	Command string
	Class   string // e.g. GenericError, CommandNotFound, DeviceNotFound
	Desc    string
}

func (e *QMPError) Error() string {
	return fmt.Sprintf("%v: %s: %s: %s", ErrCommandFailed, e.Command, e.Class, e.Desc)
}

func (e *QMPError) Unwrap() error { return ErrCommandFailed }

// BoundsError carries the refused point and the capture it was checked against.
type BoundsError struct {
	X, Y          int
	Width, Height int
}

func (e *BoundsError) Error() string {
	return fmt.Sprintf("%v: (%d,%d) not in [0,%d)x[0,%d)", ErrOutOfBounds, e.X, e.Y, e.Width, e.Height)
}

func (e *BoundsError) Unwrap() error { return ErrOutOfBounds }
