package receiver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/receiver/spawn"
)

// CgroupV1Config is one cgroup v1 hierarchy commands start in. The
// spawning thread of every command joins Commands right before it forks
// and returns to Receiver right after (spawn.CgroupV1), so the command
// and everything it starts are counted in Commands, where the computer
// set its limit, and the receiver is not.
type CgroupV1Config struct {
	// Commands is the v1 cgroup directory commands start in.
	Commands string `json:"commands"`
	// Receiver is the v1 cgroup directory of the receiver itself in the
	// same hierarchy.
	Receiver string `json:"receiver"`
}

// cgroupsV1 holds the open tasks files of every configured hierarchy;
// nil when none is configured. A start holds mu for reading while spawn
// uses the files; close takes it for writing, so no descriptor is closed
// (and its number reused) under a start.
type cgroupsV1 struct {
	spec  []spawn.CgroupV1
	files []*os.File

	mu     sync.RWMutex
	closed bool
}

// errCgroupsV1Closed is returned by acquire once close has begun.
var errCgroupsV1Closed = errors.New("the receiver is closing its cgroup v1 files")

// openCgroupsV1 opens the tasks files of every hierarchy in cfg, each
// checked: on a cgroup v1 file system (statfs magic), and the directory
// and its tasks file owned by uid 0 and not group- or other-writable, so
// no command can move itself out. It fails naming the failed check.
func openCgroupsV1(cfg []CgroupV1Config) (*cgroupsV1, error) {
	if len(cfg) == 0 {
		return nil, nil
	}
	cv := &cgroupsV1{}
	for _, c := range cfg {
		join, err := cv.openTasks(c.Commands)
		if err != nil {
			cv.close()
			return nil, err
		}
		back, err := cv.openTasks(c.Receiver)
		if err != nil {
			cv.close()
			return nil, err
		}
		cv.spec = append(cv.spec, spawn.CgroupV1{Join: join, Back: back})
	}
	return cv, nil
}

// openTasks checks dir and opens its tasks file for writing.
func (cv *cgroupsV1) openTasks(dir string) (*os.File, error) {
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: check the v1 cgroup exists: %w", ErrCgroup, err)
	}
	defer d.Close()
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(d.Fd()), &fs); err != nil || fs.Type != unix.CGROUP_SUPER_MAGIC {
		return nil, fmt.Errorf("%w: check cgroup v1 file system: %s (statfs type 0x%x, %v)", ErrCgroup, dir, fs.Type, err)
	}
	if err := v1RootsAlone(int(d.Fd()), dir); err != nil {
		return nil, err
	}
	fd, err := unix.Openat(int(d.Fd()), "tasks", unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %w", ErrCgroup, filepath.Join(dir, "tasks"), err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, "tasks"))
	cv.files = append(cv.files, f)
	return f, nil
}

// v1RootsAlone requires the v1 cgroup directory fd (named dir in
// messages), its cgroup.procs and its tasks to be owned by uid 0 and not
// group- or other-writable.
func v1RootsAlone(fd int, dir string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%w: check the v1 cgroup is root's alone: stat %s: %w", ErrCgroup, dir, err)
	}
	if err := rootsAlone(dir, &st); err != nil {
		return err
	}
	for _, f := range []string{"cgroup.procs", "tasks"} {
		if err := unix.Fstatat(fd, f, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%w: check the v1 cgroup is root's alone: stat %s/%s: %w", ErrCgroup, dir, f, err)
		}
		if err := rootsAlone(dir+"/"+f, &st); err != nil {
			return err
		}
	}
	return nil
}

// acquire returns the hierarchies for spawn.Spec.CgroupsV1 (nil when
// none is configured) and a release the caller calls once spawn.Start
// returned; after close it refuses.
func (cv *cgroupsV1) acquire() ([]spawn.CgroupV1, func(), error) {
	if cv == nil {
		return nil, func() {}, nil
	}
	cv.mu.RLock()
	if cv.closed {
		cv.mu.RUnlock()
		return nil, nil, errCgroupsV1Closed
	}
	return cv.spec, cv.mu.RUnlock, nil
}

// close waits for the starts using the files, then closes them. Safe on
// nil and twice.
func (cv *cgroupsV1) close() {
	if cv == nil {
		return
	}
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if cv.closed {
		return
	}
	cv.closed = true
	for _, f := range cv.files {
		f.Close()
	}
}
