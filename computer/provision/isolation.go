package provision

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission"
)

// Isolation tiers of a Local computer; see Options.Isolation.
const (
	// IsolationNamespaces starts the receiver in new mount, PID, network,
	// IPC and UTS namespaces with the grant's resource limits enforced:
	// the default.
	IsolationNamespaces = "namespaces"
	// IsolationOff is the computer without namespaces or resource limits
	// (its receiver on loopback TCP, its root a directory on the host's
	// file system): the baseline the benchmarks compare against. It is
	// not a sandbox: nothing bounds what a command does to the host
	// beyond the grant's uid, Landlock and the cgroup containment.
	IsolationOff = "off"
)

// DefaultResources are the resource limits a zero field of
// Options.Limits takes on a computer with IsolationNamespaces (the
// values `tether-demo up` prints and its flags default to).
var DefaultResources = admission.Limits{MaxPids: 256, MaxMemoryBytes: 1 << 30, MaxDiskBytes: 2 << 30,
	MaxOpenFiles: 4096, MaxFileSizeBytes: 1 << 30}

// Floors of the resource limits a namespaced computer accepts.
const (
	// MinOpenFiles: the receiver lives under the same RLIMIT_NOFILE as
	// its commands (it holds a few descriptors per running command).
	MinOpenFiles = 1024
	// MinMemoryBytes and MinDiskBytes keep a computer usable at all.
	MinMemoryBytes = 16 << 20
	MinDiskBytes   = 4 << 20
)

// resources fills the zero resource limits of l from DefaultResources
// and checks them: every one positive and above its floor, and a file
// size limit that lets the receiver write any file the grant allows (the
// receiver's own RLIMIT_FSIZE is the commands'). Errors wrap ErrOptions.
func resources(l admission.Limits) (admission.Limits, error) {
	d := DefaultResources
	for _, f := range []struct{ v, def *int64 }{{&l.MaxPids, &d.MaxPids}, {&l.MaxMemoryBytes, &d.MaxMemoryBytes},
		{&l.MaxDiskBytes, &d.MaxDiskBytes}, {&l.MaxOpenFiles, &d.MaxOpenFiles}, {&l.MaxFileSizeBytes, &d.MaxFileSizeBytes}} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	fileBytes := l.MaxFileBytes
	if fileBytes == 0 {
		fileBytes = DefaultLimits.MaxFileBytes
	}
	switch {
	case l.MaxPids < 1:
		return l, fmt.Errorf("%w: max_pids %d must be positive", ErrOptions, l.MaxPids)
	case l.MaxMemoryBytes < MinMemoryBytes:
		return l, fmt.Errorf("%w: max_memory_bytes %d is below %d", ErrOptions, l.MaxMemoryBytes, MinMemoryBytes)
	case l.MaxDiskBytes < MinDiskBytes:
		return l, fmt.Errorf("%w: max_disk_bytes %d is below %d", ErrOptions, l.MaxDiskBytes, MinDiskBytes)
	case l.MaxOpenFiles < MinOpenFiles:
		return l, fmt.Errorf("%w: max_open_files %d is below %d (the receiver lives under the same limit)", ErrOptions, l.MaxOpenFiles, MinOpenFiles)
	case l.MaxFileSizeBytes < fileBytes:
		return l, fmt.Errorf("%w: max_file_size_bytes %d is below max_file_bytes %d (the receiver writes such files under the same limit)",
			ErrOptions, l.MaxFileSizeBytes, fileBytes)
	}
	return l, nil
}

// chooseIsolation resolves Options.Isolation ("" is IsolationNamespaces).
func chooseIsolation(mode string) (string, error) {
	switch mode {
	case "", IsolationNamespaces:
		return IsolationNamespaces, nil
	case IsolationOff:
		return IsolationOff, nil
	}
	return "", fmt.Errorf("%w: isolation %q is not %q or %q", ErrOptions, mode, IsolationNamespaces, IsolationOff)
}

// namespaced reports whether the computer runs its receiver in its own
// namespaces.
func (s State) namespaced() bool { return s.Isolation == IsolationNamespaces }

// What the stage makes visible inside a namespaced computer.
var (
	// stageSystem are bound read-only (nosuid, nodev) at the same path;
	// Landlock, when required, narrows what commands read of them. /etc
	// is the computer's own (etc.go).
	stageSystemPaths = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}
	stageDevicePaths = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}
)

// Sizes of the private file systems of a namespaced computer: /tmp,
// /var/tmp and /dev/shm take a quarter of its memory each (their pages
// are charged to the commands' memory limit as well, which bounds their
// sum), /run a fixed 16 MiB. The home is not among them: it is a
// directory of the computer's disk (disk.go).
const runBytes = 16 << 20

// tmpfsMounts are the private, size-limited file systems for memory
// bytes of memory.
func tmpfsMounts(memory int64) []stageTmpfs {
	q := memory / 4
	inodes := func(b int64) int64 { return max(b/(16<<10), 1024) }
	return []stageTmpfs{
		{Path: "/tmp", Bytes: q, Inodes: inodes(q), Mode: 0o1777},
		{Path: "/var/tmp", Bytes: q, Inodes: inodes(q), Mode: 0o1777},
		{Path: "/dev/shm", Bytes: q, Inodes: inodes(q), Mode: 0o1777},
		{Path: "/run", Bytes: runBytes, Inodes: 1024, Mode: 0o755},
		{Path: refusalMount, Bytes: refusalMountBytes, Inodes: 16, Mode: 0o755}, // refusals.go
	}
}

// stageSpec is what the stage of this computer does: the receiver's
// view (system paths read-only, the computer's own paths, the disk's
// home at Home, private tmpfs, its cgroups), the limits and the receiver's command line.
func (c *Local) stageSpec() stageSpec {
	p, s := c.paths, c.state
	recv := c.opts.Bins.Path("tether-receiver")
	binds := []stageBind{{Path: p.root, Writable: true}, {Path: p.run, Writable: true}, {Path: p.receiver},
		{Path: p.admission}, {Path: p.admissionPub}, {Path: recv},
		{Path: p.diskHome, At: Home, Writable: true}}
	if s.CgroupParent != "" {
		binds = append(binds, stageBind{Path: s.CgroupParent, Writable: true})
	}
	var procs []string
	for _, d := range s.LimitCgroups {
		binds = append(binds, stageBind{Path: d, Writable: true})
		procs = append(procs, filepath.Join(d, "receiver", "cgroup.procs"))
	}
	l := s.Resources
	return stageSpec{NewRoot: p.newRoot, Hostname: s.Tuple.Sandbox, System: stageSystemPaths, Devices: stageDevicePaths,
		Etc: s.etcSpec(), Binds: binds, Tmpfs: tmpfsMounts(l.MaxMemoryBytes), Cgroups: procs,
		Rlimits: []stageRlimit{{unix.RLIMIT_NPROC, uint64(l.MaxPids)}, {unix.RLIMIT_NOFILE, uint64(l.MaxOpenFiles)},
			{unix.RLIMIT_FSIZE, uint64(l.MaxFileSizeBytes)}},
		Exec: []string{recv, "--config", p.receiverConfig}}
}

// namespaceFlags are the namespaces a computer's stage starts in.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS

// stageCommand returns the command that starts the stage: this binary
// with StageArg, in new namespaces and its own session, reading spec on
// descriptor 3 (the pipe's read end, which the caller closes after
// Start).
func (c *Local) stageCommand() (*exec.Cmd, *os.File, error) {
	spec, err := json.Marshal(c.stageSpec())
	if err != nil {
		return nil, nil, err
	}
	cmd, r, w, err := stageProcess()
	if err != nil {
		return nil, nil, err
	}
	_, err = w.Write(spec) // well below a pipe's buffer
	w.Close()
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return cmd, r, nil
}

// stageProcess returns the command that starts the stage (this binary
// with StageArg, in new namespaces and its own session) and the pipe its
// spec goes through: the read end is the stage's descriptor 3 (the
// caller closes it after Start), the write end the caller's to write the
// spec to and close. The stage reads until the write end is closed.
func stageProcess() (cmd *exec.Cmd, r, w *os.File, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("find this binary for the computer's stage: %w", err)
	}
	if r, w, err = os.Pipe(); err != nil {
		return nil, nil, nil, err
	}
	cmd = exec.Command(exe, StageArg)
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: namespaceFlags}
	return cmd, r, w, nil
}
