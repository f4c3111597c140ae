package provision

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/egress/nsthread"
)

// The stage is the first process of a local computer's namespaces. Local
// starts it (the binary that links this package, re-executed with
// StageArg) as root with every capability in new mount, PID, network,
// IPC and UTS namespaces; as PID 1 it builds the computer's file system
// view (its own /etc among it), brings up loopback, names the host, sets
// the resource limits every command inherits, and executes
// tether-receiver, which keeps PID 1 and only its seven capabilities. Nothing of the stage runs after
// that exec.

// StageArg is argv[1] of the stage. A binary that links this package runs
// the stage from the package's init when it is started with it.
const StageArg = "__tether-computer-stage"

// stageSpecFD is the descriptor the stage reads its stageSpec from.
const stageSpecFD = 3

// stageSpec is everything the stage does, decided by Local.
type stageSpec struct {
	// NewRoot is an empty directory the new root file system (a small
	// tmpfs) is mounted on before pivot_root.
	NewRoot string `json:"new_root"`
	// Hostname is the UTS namespace's host name.
	Hostname string `json:"hostname"`
	// System lists host directories bound read-only at the same path
	// (a symlink, as merged-/usr systems have, is recreated instead);
	// missing ones are skipped.
	System []string `json:"system"`
	// Etc, when set, is the computer's own /etc (etc.go).
	Etc *stageEtc `json:"etc,omitempty"`
	// Devices lists host device files bound at the same path.
	Devices []string `json:"devices"`
	// Binds are the computer's own paths, at the same path unless At
	// says otherwise.
	Binds []stageBind `json:"binds"`
	// Tmpfs are private, size-limited file systems (/tmp, /run, ...).
	Tmpfs []stageTmpfs `json:"tmpfs"`
	// Cgroups are cgroup.procs files (cgroup v1) the stage moves itself
	// into, and so the receiver.
	Cgroups []string `json:"cgroups"`
	// JoinThread moves only the stage's thread that executes the receiver
	// into Cgroups (their tasks files), not the whole process: the
	// receiver, made by that thread's exec, is in them all the same. A
	// process's move takes the kernel's global cgroup lock, whose first
	// writer waits for an RCU grace period (about 14 ms on the build
	// machine); a thread moving itself does not take it.
	JoinThread bool `json:"join_thread,omitempty"`
	// Rlimits are set (soft and hard) before the receiver starts.
	Rlimits []stageRlimit `json:"rlimits"`
	// Exec is the receiver's argv; Exec[0] is absolute.
	Exec []string `json:"exec"`
}

type stageBind struct {
	Path string `json:"path"`
	// At, when set, is where Path is bound inside (the home).
	At       string `json:"at,omitempty"`
	Writable bool   `json:"writable"`
}

// inside is where b is bound in the computer's view.
func (b stageBind) inside() string {
	if b.At != "" {
		return b.At
	}
	return b.Path
}

type stageTmpfs struct {
	Path   string `json:"path"`
	Bytes  int64  `json:"bytes"`
	Inodes int64  `json:"inodes"`
	Mode   uint32 `json:"mode"`
	// UID and GID own its root (root's when zero).
	UID uint32 `json:"uid,omitempty"`
	GID uint32 `json:"gid,omitempty"`
}

type stageRlimit struct {
	Resource int    `json:"resource"`
	Value    uint64 `json:"value"`
}

func init() {
	if len(os.Args) == 2 && os.Args[1] == StageArg {
		os.Exit(stageMain(os.Stderr))
	}
}

// stageMain runs the stage's steps in order and executes the receiver;
// it returns only on a failure, which it reports on w (the receiver's
// log) naming the step.
func stageMain(w io.Writer) int {
	spec, err := readStageSpec()
	if err == nil {
		err = runStage(spec)
	}
	fmt.Fprintf(w, "computer stage: %v\n", err)
	return 1
}

func readStageSpec() (stageSpec, error) {
	var spec stageSpec
	if os.Getpid() != 1 {
		return spec, fmt.Errorf("check PID 1 of a new PID namespace: pid is %d", os.Getpid())
	}
	f := os.NewFile(stageSpecFD, "stage-spec")
	defer f.Close()
	if err := strictjson.Read(f, 1<<20, &spec); err != nil {
		return spec, fmt.Errorf("decode the spec: %w", err)
	}
	if len(spec.Exec) == 0 || !filepath.IsAbs(spec.Exec[0]) || !filepath.IsAbs(spec.NewRoot) {
		return spec, errors.New("decode the spec: exec and new_root must be absolute")
	}
	return spec, nil
}

// runStage is the stage's steps, each named in its error. With
// JoinThread the goroutine stays on one thread from the join to the
// exec, so the thread that joined is the one that becomes the receiver.
func runStage(s stageSpec) error {
	if s.JoinThread {
		runtime.LockOSThread() // never unlocked: this thread executes the receiver
	}
	for _, step := range []struct {
		name string
		run  func(stageSpec) error
	}{
		{"join cgroups", stageJoinCgroups},
		{"new root", stageNewRoot},
		{"system paths", stageSystem},
		{"etc", stageEtcMount},
		{"devices", stageDevices},
		{"proc", stageProc},
		{"tmpfs", stageTmpfsMounts},
		{"computer paths", stageBinds},
		{"pivot_root", stagePivot},
		{"loopback", stageLoopback},
		{"hostname", func(s stageSpec) error { return unix.Sethostname([]byte(s.Hostname)) }},
		{"rlimits", stageRlimits},
	} {
		if err := step.run(s); err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
	}
	err := unix.Exec(s.Exec[0], s.Exec, []string{})
	return fmt.Errorf("execute %s: %w", s.Exec[0], err)
}

func stageJoinCgroups(s stageSpec) error {
	if s.JoinThread {
		return stageJoinThread(s.Cgroups)
	}
	for _, p := range s.Cgroups {
		if err := os.WriteFile(p, []byte("0"), 0); err != nil {
			return err
		}
	}
	return nil
}

// stageJoinThread moves the calling thread (locked to its goroutine by
// runStage) into the cgroup of each cgroup.procs file in procs, through
// the tasks file beside it, and checks that each tasks file then lists
// the thread: a thread not moved would make a receiver outside its
// cgroups.
func stageJoinThread(procs []string) error {
	tid := strconv.Itoa(unix.Gettid())
	for _, p := range procs {
		tasks := filepath.Join(filepath.Dir(p), "tasks")
		if err := os.WriteFile(tasks, []byte("0"), 0); err != nil {
			return err
		}
		b, err := os.ReadFile(tasks)
		if err != nil {
			return err
		}
		if !slices.Contains(strings.Fields(string(b)), tid) {
			return fmt.Errorf("thread %s is not in %s after joining it", tid, tasks)
		}
	}
	return nil
}

// stageNewRoot stops every mount event from propagating to the host and
// mounts the new root's tmpfs.
func stageNewRoot(s stageSpec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	return unix.Mount("tether-root", s.NewRoot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
}

// under returns p inside the new root.
func (s stageSpec) under(p string) string { return filepath.Join(s.NewRoot, p) }

func stageSystem(s stageSpec) error {
	for _, p := range s.System {
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return err
		case fi.Mode()&os.ModeSymlink != 0:
			if err := stageSymlink(s, p); err != nil {
				return err
			}
		default:
			if err := bindAt(p, s.under(p), unix.MS_RDONLY|unix.MS_NODEV); err != nil {
				return err
			}
		}
	}
	return nil
}

func stageSymlink(s stageSpec, p string) error {
	target, err := os.Readlink(p)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.under(p)), 0o755); err != nil {
		return err
	}
	return os.Symlink(target, s.under(p))
}

// stageDevices makes /dev a small tmpfs with the listed devices bound in,
// the usual /proc/self/fd links, and nothing else.
func stageDevices(s stageSpec) error {
	dev := s.under("/dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tether-dev", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755"); err != nil {
		return err
	}
	for _, d := range s.Devices {
		if err := bindAt(d, s.under(d), unix.MS_NOEXEC); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return nil
}

// stageProc mounts a procfs of the new PID namespace: only the
// computer's processes are in it.
func stageProc(s stageSpec) error {
	p := s.under("/proc")
	if err := os.MkdirAll(p, 0o555); err != nil {
		return err
	}
	return unix.Mount("proc", p, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

func stageTmpfsMounts(s stageSpec) error {
	for _, t := range s.Tmpfs {
		p := s.under(t.Path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=%o,uid=%d,gid=%d", t.Bytes, t.Inodes, t.Mode, t.UID, t.GID)
		if err := unix.Mount("tether-tmp", p, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("%s: %w", t.Path, err)
		}
	}
	return nil
}

func stageBinds(s stageSpec) error {
	for _, b := range s.Binds {
		flags := uintptr(unix.MS_NODEV)
		if !b.Writable {
			flags |= unix.MS_RDONLY
		}
		if err := bindAt(b.Path, s.under(b.inside()), flags); err != nil {
			return err
		}
	}
	return nil
}

// bindAt binds src (a directory, recursively, or a file) at dst, made as
// needed, and remounts the bind nosuid plus flags.
func bindAt(src, dst string, flags uintptr) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := mountPoint(dst, fi.IsDir()); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|flags, ""); err != nil {
		return fmt.Errorf("remount %s: %w", dst, err)
	}
	return nil
}

// mountPoint makes dst, a directory or an empty file, and its parents.
func mountPoint(dst string, dir bool) error {
	if dir {
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// stagePivot makes the new root the root of the namespace, drops the old
// one entirely and makes the root's own tmpfs read-only.
func stagePivot(s stageSpec) error {
	if err := unix.Chdir(s.NewRoot); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return err
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	return unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
}

// stageLoopback brings up lo, the only interface of the new network
// namespace.
func stageLoopback(stageSpec) error { return nsthread.LoopbackUp() }

func stageRlimits(s stageSpec) error {
	for _, r := range s.Rlimits {
		if err := unix.Setrlimit(r.Resource, &unix.Rlimit{Cur: r.Value, Max: r.Value}); err != nil {
			return fmt.Errorf("resource %s: %w", strconv.Itoa(r.Resource), err)
		}
	}
	return nil
}
