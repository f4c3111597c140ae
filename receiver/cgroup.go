package receiver

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup modes of CgroupConfig.
const (
	// CgroupOff starts children in the receiver's own cgroup; a
	// descendant that leaves the command's process group (setsid,
	// setpgid) survives every kill.
	CgroupOff = "off"
	// CgroupRequired forks every command straight into its own cgroup
	// <parent>/<terminal id> and kills that cgroup (cgroup.kill) with the
	// group, so nothing a command started outlives it; the receiver
	// refuses to start unless parent is a usable cgroup v2 directory.
	CgroupRequired = "required"
)

// CgroupConfig says whether commands are contained in cgroups.
type CgroupConfig struct {
	// Mode is CgroupOff or CgroupRequired; "" means off.
	Mode string `json:"mode"`
	// Parent is the absolute, clean path of an existing cgroup v2
	// directory that belongs to this receiver alone (it holds a lock on
	// it while it runs). Required with CgroupRequired.
	Parent string `json:"parent,omitempty"`
	// V1 lists cgroup v1 hierarchies (pids, memory) every command starts
	// in, where the cgroup2 mount lacks those controllers (a hybrid
	// host): the computer keeps its limits there. Independent of Mode.
	V1 []CgroupV1Config `json:"v1,omitempty"`
}

// ErrCgroup wraps every refusal of the cgroup checks; the message names
// the failed check.
var ErrCgroup = errors.New("cgroup containment")

func (c CgroupConfig) validate() error {
	for i, v := range c.V1 {
		if !absClean(v.Commands) || !absClean(v.Receiver) || v.Commands == v.Receiver {
			return fmt.Errorf("v1[%d]: commands %q and receiver %q must be two absolute clean paths", i, v.Commands, v.Receiver)
		}
	}
	switch c.Mode {
	case "", CgroupOff:
		if c.Parent != "" && !absClean(c.Parent) {
			return fmt.Errorf("parent %q is not an absolute clean path", c.Parent)
		}
	case CgroupRequired:
		if !absClean(c.Parent) {
			return fmt.Errorf("parent %q is not an absolute clean path (required with mode %q)", c.Parent, CgroupRequired)
		}
	default:
		return fmt.Errorf("mode must be %q or %q, not %q", CgroupOff, CgroupRequired, c.Mode)
	}
	return nil
}

// cgroupDrain bounds how long a killed cgroup may take to empty before
// its removal is given up (and logged): SIGKILLed processes exit at once
// unless stuck in the kernel.
const cgroupDrain = 10 * time.Second

// cgroups is the parent cgroup of every command's cgroup; nil when off.
type cgroups struct {
	parent string
	dir    *os.File // the parent, O_RDONLY: holds the exclusive flock
	log    *slog.Logger
	live   sync.WaitGroup // command cgroups not yet removed

	mu     sync.Mutex // orders create's live.Add against close
	closed bool       // set by close: create refuses
}

// errCgroupsClosed is wrapped by create once close has begun: the parent
// is about to be released, no command cgroup may be made in it.
var errCgroupsClosed = errors.New("the receiver is closing its cgroup parent")

// newCgroups checks the parent and takes it: a directory on a cgroup2
// file system, locked by no other receiver, in which a probe cgroup has
// cgroup.kill (kernel >= 5.14, which also has clone3 CLONE_INTO_CGROUP).
// Command cgroups a previous receiver left behind (it was killed before
// it could remove them) are killed and removed. nil when off.
func newCgroups(c CgroupConfig, log *slog.Logger) (*cgroups, error) {
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	if c.Mode != CgroupRequired {
		return nil, nil
	}
	dir, err := os.OpenFile(c.Parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: check parent exists: %w", ErrCgroup, err)
	}
	cg := &cgroups{parent: c.Parent, dir: dir, log: log}
	if err := cg.check(); err != nil {
		dir.Close()
		return nil, err
	}
	cg.removeStale()
	return cg, nil
}

// check runs the start-up checks on the opened parent.
func (cg *cgroups) check() error {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(cg.dir.Fd()), &fs); err != nil {
		return fmt.Errorf("%w: check cgroup2 file system: statfs %s: %w", ErrCgroup, cg.parent, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("%w: check cgroup2 file system: %s is on file system type 0x%x, not cgroup2 (0x%x)",
			ErrCgroup, cg.parent, fs.Type, unix.CGROUP2_SUPER_MAGIC)
	}
	if err := checkRootsAlone(cg.dir, cg.parent); err != nil {
		return err
	}
	if err := unix.Flock(int(cg.dir.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("%w: check parent is this receiver's alone: lock %s: %w (another receiver uses it)", ErrCgroup, cg.parent, err)
	}
	probe := newProbeName()
	if err := unix.Mkdirat(int(cg.dir.Fd()), probe, 0o755); err != nil {
		return fmt.Errorf("%w: check a child cgroup can be created: mkdir %s: %w", ErrCgroup, filepath.Join(cg.parent, probe), err)
	}
	var st unix.Stat_t
	errKill := unix.Fstatat(int(cg.dir.Fd()), probe+"/cgroup.kill", &st, unix.AT_SYMLINK_NOFOLLOW)
	if err := unix.Unlinkat(int(cg.dir.Fd()), probe, unix.AT_REMOVEDIR); err != nil {
		return fmt.Errorf("%w: check a probe cgroup can be removed: rmdir %s: %w", ErrCgroup, filepath.Join(cg.parent, probe), err)
	}
	if errKill != nil {
		return fmt.Errorf("%w: check cgroup.kill (kernel >= 5.14): %s/cgroup.kill: %w", ErrCgroup, filepath.Join(cg.parent, probe), errKill)
	}
	return nil
}

// errNotRootsAlone is wrapped when a cgroup directory or control file
// on the way from the parent to the cgroup2 mount root belongs to
// someone other than root or is writable by group or others: whoever can
// write there can move a command's process out of its cgroup (into an
// ancestor's cgroup.procs), where cgroup.kill no longer reaches it.
var errNotRootsAlone = errors.New("not owned by uid 0 alone")

// checkRootsAlone walks from the opened parent up to the cgroup2 mount
// root (the last directory before ".." leaves the file system, or "/")
// and requires each directory, its cgroup.procs and its cgroup.threads
// to be owned by uid 0 and not group- or other-writable. Every step is
// opened through the descriptor below it (O_PATH, no path lookup from /).
// dir stays open; the descriptors it opens are closed.
func checkRootsAlone(dir *os.File, parent string) error {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: check parent is root's alone: open %s: %w", ErrCgroup, parent, err)
	}
	name := parent
	for {
		st, err := checkOneRootsAlone(fd, name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		up, err := unix.Openat(fd, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("%w: check parent is root's alone: open %s/..: %w", ErrCgroup, name, err)
		}
		var ust unix.Stat_t
		if err := unix.Fstat(up, &ust); err != nil {
			unix.Close(up)
			return fmt.Errorf("%w: check parent is root's alone: stat %s/..: %w", ErrCgroup, name, err)
		}
		if ust.Dev != st.Dev || ust.Ino == st.Ino { // name is the mount root
			unix.Close(up)
			return nil
		}
		fd, name = up, filepath.Dir(name)
	}
}

// checkOneRootsAlone checks the cgroup directory fd (named name in
// messages), its cgroup.procs and cgroup.threads, and returns the
// directory's stat.
func checkOneRootsAlone(fd int, name string) (unix.Stat_t, error) {
	var dst unix.Stat_t
	if err := unix.Fstat(fd, &dst); err != nil {
		return dst, fmt.Errorf("%w: check parent is root's alone: stat %s: %w", ErrCgroup, name, err)
	}
	if err := rootsAlone(name, &dst); err != nil {
		return dst, err
	}
	for _, f := range []string{"cgroup.procs", "cgroup.threads"} {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, f, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return dst, fmt.Errorf("%w: check parent is root's alone: stat %s/%s: %w", ErrCgroup, name, f, err)
		}
		if err := rootsAlone(name+"/"+f, &st); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// rootsAlone refuses st unless it is owned by uid 0 and not writable by
// group or others.
func rootsAlone(name string, st *unix.Stat_t) error {
	if st.Uid != 0 || st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: check parent is root's alone: %s has owner uid %d, mode %#o: %w",
			ErrCgroup, name, st.Uid, st.Mode&0o7777, errNotRootsAlone)
	}
	return nil
}

// removeStale kills and removes the command cgroups (isTerminalCgroup)
// and start-up probes (isProbeCgroup) a previous receiver left in the
// parent; nothing else in it is touched. The parent is listed through
// the locked descriptor, not its path. Each is logged; one that cannot be
// removed stays, logged by path.
func (cg *cgroups) removeStale() {
	names, err := cg.children()
	if err != nil {
		cg.log.Error("receiver: cannot list the cgroup parent for stale command cgroups", "parent", cg.parent, "err", err)
		return
	}
	for _, name := range names {
		if !isTerminalCgroup(name) && !isProbeCgroup(name) {
			continue
		}
		tc, err := cg.open(name)
		if err == nil {
			cg.log.Warn("receiver: killing a command cgroup left by a previous receiver", "cgroup", tc.path)
			cg.live.Add(1)
			err = cg.remove(tc)
		}
		if err != nil {
			cg.log.Error("receiver: stale command cgroup not removed", "cgroup", filepath.Join(cg.parent, name), "err", err)
		}
	}
}

// children lists the names of the parent's subdirectories through a
// fresh descriptor of the locked directory (cg.dir keeps its offset).
func (cg *cgroups) children() ([]string, error) {
	fd, err := unix.Openat(int(cg.dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(fd), cg.parent)
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// isTerminalCgroup reports whether name has the form of a command cgroup:
// newTerminalID's "t-" and 32 lowercase hex digits.
func isTerminalCgroup(name string) bool {
	rest, ok := strings.CutPrefix(name, "t-")
	return ok && isLowerHex(rest, 32)
}

// isProbeCgroup reports whether name has the form of a start-up probe:
// newProbeName's "probe-" and 16 lowercase hex digits.
func isProbeCgroup(name string) bool {
	rest, ok := strings.CutPrefix(name, "probe-")
	return ok && isLowerHex(rest, 16)
}

// isLowerHex reports whether s is exactly n digits of 0-9a-f.
func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// newProbeName returns the name of a start-up probe cgroup: 64 random
// bits in hex.
func newProbeName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "probe-" + hex.EncodeToString(b[:])
}

// termCgroup is one command's cgroup.
type termCgroup struct {
	name string   // the terminal id, its directory name in the parent
	path string   // for messages
	dir  *os.File // O_PATH directory: spawn.Spec.Cgroup
}

// create makes the command's cgroup <parent>/<id> (0755, root's: the
// command's uid can neither write its files nor create cgroups in it)
// and opens it. remove must follow. Once close has begun it refuses
// (errCgroupsClosed) and creates nothing; a create counted before close
// is waited for by close.
func (cg *cgroups) create(id string) (*termCgroup, error) {
	if err := cg.hold(); err != nil {
		return nil, fmt.Errorf("%w: create the command's cgroup %s: %w", ErrCgroup, filepath.Join(cg.parent, id), err)
	}
	if err := unix.Mkdirat(int(cg.dir.Fd()), id, 0o755); err != nil {
		cg.live.Done()
		return nil, fmt.Errorf("%w: create the command's cgroup %s: %w", ErrCgroup, filepath.Join(cg.parent, id), err)
	}
	tc, err := cg.open(id)
	if err != nil {
		_ = unix.Unlinkat(int(cg.dir.Fd()), id, unix.AT_REMOVEDIR)
		cg.live.Done()
		return nil, err
	}
	return tc, nil
}

// hold counts one more live command cgroup unless close has begun.
func (cg *cgroups) hold() error {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if cg.closed {
		return errCgroupsClosed
	}
	cg.live.Add(1)
	return nil
}

// file returns the cgroup's directory for spawn.Spec.Cgroup; nil for a
// nil tc (containment off).
func (tc *termCgroup) file() *os.File {
	if tc == nil {
		return nil
	}
	return tc.dir
}

func (cg *cgroups) open(name string) (*termCgroup, error) {
	p := filepath.Join(cg.parent, name)
	fd, err := unix.Openat(int(cg.dir.Fd()), name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open the command's cgroup %s: %w", ErrCgroup, p, err)
	}
	return &termCgroup{name: name, path: p, dir: os.NewFile(uintptr(fd), p)}, nil
}

// remove kills every process in the command's cgroup, waits (at most
// cgroupDrain, woken by cgroup.events) until it is empty and removes it.
// It closes tc either way; an error names the cgroup left behind.
func (cg *cgroups) remove(tc *termCgroup) error {
	defer cg.live.Done()
	defer tc.dir.Close()
	err := writeAt(tc.dir, "cgroup.kill", "1")
	if err == nil {
		err = waitEmpty(tc.dir, time.Now().Add(cgroupDrain))
	}
	if err == nil {
		err = unix.Unlinkat(int(cg.dir.Fd()), tc.name, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return fmt.Errorf("%w: remove the command's cgroup %s: %w", ErrCgroup, tc.path, err)
	}
	return nil
}

// close makes every later create refuse, waits until every command
// cgroup is removed, then releases the parent and its lock. Safe on nil;
// call it once.
func (cg *cgroups) close() {
	if cg == nil {
		return
	}
	cg.mu.Lock()
	cg.closed = true
	cg.mu.Unlock()
	cg.live.Wait()
	cg.dir.Close()
}

// writeAt writes value to the file name beneath the directory dir.
func writeAt(dir *os.File, name, value string) error {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(value)); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// errNotEmpty is returned when a killed cgroup is still populated at the
// deadline.
var errNotEmpty = errors.New("still populated after cgroup.kill")

// waitEmpty waits until cgroup.events of dir says "populated 0". The
// kernel signals every change of the file as POLLPRI; the poll is also
// bounded to 100 ms so a missed notification costs at most that.
func waitEmpty(dir *os.File, deadline time.Time) error {
	fd, err := unix.Openat(int(dir.Fd()), "cgroup.events", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup.events: %w", err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 256)
	for {
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("read cgroup.events: %w", err)
		}
		if bytes.Contains(buf[:n], []byte("populated 0\n")) {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return errNotEmpty
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
		if _, err := unix.Poll(pfd, int(min(left, 100*time.Millisecond)/time.Millisecond)+1); err != nil && err != unix.EINTR {
			return fmt.Errorf("poll cgroup.events: %w", err)
		}
	}
}
