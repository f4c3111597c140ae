package provision

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/receiver"
)

// Where a namespaced computer shows the egress proxy's refusals to its
// commands: one line per refusal appended to RefusalLog, on a tmpfs of
// its own at /run/tether (root's, mode 0755, 1 MiB; the stage mounts it,
// and the commands' Landlock rules let them read it), so the commands
// read the file and cannot write, replace or redirect it. When a line
// would take the file past MaxRefusalLogBytes it is renamed to
// RefusalLog + ".1" (the one before is dropped) and a new file begun, so
// the two hold at most twice that.
const (
	RefusalLog         = refusalMount + "/" + refusalFile
	refusalMount       = "/run/tether"
	refusalMountBytes  = 1 << 20
	refusalDir         = "run/tether"
	refusalFile        = "egress-refused.log"
	MaxRefusalLogBytes = 256 << 10
	maxRefusalField    = 512 // bytes of a host or reason kept in a line
)

// refusalReadExec is what a namespaced computer's commands may read and
// execute beneath: the receiver's default and the refusals' tmpfs.
func refusalReadExec() []string {
	return append(slices.Clone(receiver.DefaultLandlockReadExec), refusalMount)
}

// RefusalLog implements api.RefusalRecorder: RefusalLog.
func (m *Machine) RefusalLog() string { return RefusalLog }

// RecordRefusal implements api.RefusalRecorder (Local.RecordRefusal).
func (m *Machine) RecordRefusal(r policy.Refusal) error { return m.l.RecordRefusal(r) }

// RecordRefusal appends r to the computer's RefusalLog. The file is
// reached through the receiver's root (/proc/PID/root of the pinned
// receiver) without following any symlink, and must be root's.
func (c *Local) RecordRefusal(r policy.Refusal) error {
	if !c.State().namespaced() {
		return fmt.Errorf("record refusal: %w", ErrNoNetns)
	}
	c.mu.Lock()
	p := c.recv
	c.mu.Unlock()
	if p == nil {
		return fmt.Errorf("record refusal: %w: the receiver is stopped", ErrNoNetns)
	}
	dir, err := openRefusalDir(p.pid, p.ticks)
	if err != nil {
		return fmt.Errorf("record refusal: %w", err)
	}
	defer unix.Close(dir)
	if err := appendBounded(dir, refusalFile, RefusalLine(r), MaxRefusalLogBytes); err != nil {
		return fmt.Errorf("record refusal: %w", err)
	}
	return nil
}

// RefusalLine is one line of the RefusalLog: time (RFC 3339, UTC),
// "refused", the destination, the failed check and the reason; what the
// computer's client sent (the host) is quoted, so it can never start a
// line of its own. The resolved address that failed a check is left out:
// it would make the proxy an oracle of names the computer may not reach
// (an internal name's private address); the egress log keeps it.
func RefusalLine(r policy.Refusal) string {
	dest := clip(r.Host) + ":" + strconv.Itoa(int(r.Port))
	return fmt.Sprintf("%s refused %q check=%q reason=%q\n", r.Time.UTC().Format(time.RFC3339Nano), dest, clip(r.Check),
		clip(r.Reason))
}

func clip(s string) string {
	if len(s) > maxRefusalField {
		return s[:maxRefusalField]
	}
	return s
}

// openRefusalDir returns a descriptor of run/tether under the root of
// the receiver pid (checked to be the process that started at ticks),
// making the directory (root's, 0755) when missing; the caller closes
// it.
func openRefusalDir(pid int, ticks uint64) (int, error) {
	pidfd, err := pinProcess(pid, ticks)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pidfd)
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("the receiver's root: %w", err)
	}
	defer unix.Close(root)
	if !Alive(pid, ticks) {
		return -1, fmt.Errorf("%w: the receiver %d ended", ErrNoNetns, pid)
	}
	run, err := openBeneath(root, "run", unix.O_PATH|unix.O_DIRECTORY, unix.RESOLVE_IN_ROOT)
	if err != nil {
		return -1, fmt.Errorf("the computer's /run: %w", err)
	}
	defer unix.Close(run)
	if err := unix.Mkdirat(run, "tether", 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fmt.Errorf("mkdir %s: %w", refusalDir, err)
	}
	dir, err := openBeneath(run, "tether", unix.O_RDONLY|unix.O_DIRECTORY, unix.RESOLVE_BENEATH)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", refusalDir, err)
	}
	if err := rootsOnly(dir); err != nil {
		unix.Close(dir)
		return -1, fmt.Errorf("%s: %w", refusalDir, err)
	}
	if err := unix.Fchmod(dir, 0o755); err != nil { // whatever the umask
		unix.Close(dir)
		return -1, fmt.Errorf("chmod %s: %w", refusalDir, err)
	}
	return dir, nil
}

// openBeneath opens name relative to dir with no symlink and no magic
// link followed.
func openBeneath(dir int, name string, flags int, resolve uint64) (int, error) {
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: resolve | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	if flags&unix.O_CREAT != 0 {
		how.Mode = 0o644 // openat2 refuses a mode without O_CREAT
	}
	return unix.Openat2(dir, name, how)
}

// rootsOnly refuses a file not owned by root or writable by group or
// others.
func rootsOnly(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Uid != 0 || st.Mode&0o022 != 0 {
		return fmt.Errorf("owned by uid %d with mode %o, want root's and writable by no one else", st.Uid, st.Mode&0o7777)
	}
	return nil
}

// appendBounded appends line to name in dir, first renaming name to
// name.1 when the line would take it past max bytes.
func appendBounded(dir int, name, line string, max int64) error {
	var st unix.Stat_t
	err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Size+int64(len(line)) > max:
		if err := unix.Renameat(dir, name, dir, name+".1"); err != nil {
			return fmt.Errorf("rotate %s: %w", name, err)
		}
	case err != nil && !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("stat %s: %w", name, err)
	}
	fd, err := openBeneath(dir, name, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT, unix.RESOLVE_BENEATH)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if err := rootsOnly(fd); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := unix.Fchmod(fd, 0o644); err != nil { // readable by the commands, whatever the umask
		return fmt.Errorf("chmod %s: %w", name, err)
	}
	if _, err := f.WriteString(line); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
