package spawn

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/strictjson"
)

// HelperArg is argv[1] of a ModeHelper child: a binary that uses spawn
// must call HelperMain first thing in main when os.Args[1] == HelperArg.
const HelperArg = "__tether-spawn-helper"

// Descriptors a helper receives beyond stdin, stdout and stderr.
const (
	helperSpecFD    = 3 // JSON helperSpec, read to EOF
	helperStatusFD  = 4 // close-on-exec: an error message, or EOF after a successful exec
	helperDirFD     = 5 // the working directory
	helperRulesetFD = 6 // the Landlock ruleset, when helperSpec.Landlock
)

// helperSpec is what the receiver sends a helper on its spec descriptor.
type helperSpec struct {
	Path      string   `json:"path"`
	Argv      []string `json:"argv"`
	Env       []string `json:"env"`
	UID       uint32   `json:"uid"`
	GID       uint32   `json:"gid"`
	Groups    []uint32 `json:"groups"`
	ParentPID int      `json:"parent_pid"`
	Landlock  bool     `json:"landlock"`
	// Seccomp is the filter's program (Filter.bytes), empty for none.
	Seccomp []byte `json:"seccomp,omitempty"`
}

// maxHelperSpec bounds the spec a helper reads.
const maxHelperSpec = 1 << 20

// helperLaunch is the receiver's side of one helper start.
type helperLaunch struct {
	exe              string
	spec             helperSpec
	specR, specW     *os.File
	statusR, statusW *os.File
	ruleset          *os.File
}

// newHelperLaunch creates the pipes and adds the helper's descriptors to
// attr.Files.
func newHelperLaunch(spec *Spec, attr *os.ProcAttr) (*helperLaunch, error) {
	h := &helperLaunch{exe: spec.HelperPath, spec: helperSpec{Path: spec.Path, Argv: spec.Argv,
		Env: append([]string{}, spec.Env...), UID: spec.UID, GID: spec.GID,
		Groups: append([]uint32{}, spec.Groups...), ParentPID: os.Getpid(), Landlock: spec.Landlock != nil}}
	if spec.Seccomp != nil {
		h.spec.Seccomp = spec.Seccomp.bytes()
	}
	if h.exe == "" {
		h.exe = "/proc/self/exe"
	}
	var err error
	if h.specR, h.specW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("%w: helper pipe: %w", ErrStart, err)
	}
	if h.statusR, h.statusW, err = os.Pipe(); err != nil {
		h.close()
		return nil, fmt.Errorf("%w: helper pipe: %w", ErrStart, err)
	}
	attr.Files = append(attr.Files, h.specR, h.statusW, spec.Dir)
	if spec.Landlock != nil {
		fd, err := unix.Dup(spec.Landlock.fd)
		if err != nil {
			h.close()
			return nil, fmt.Errorf("%w: dup ruleset: %w", ErrStart, err)
		}
		h.ruleset = os.NewFile(uintptr(fd), "landlock-ruleset")
		attr.Files = append(attr.Files, h.ruleset)
	}
	return h, nil
}

// finish sends the spec and waits for the helper to execute the command:
// EOF on the status pipe means the exec happened; a message means the
// helper failed and exits.
func (h *helperLaunch) finish(c *Child) error {
	h.specR.Close()
	h.statusW.Close()
	h.specR, h.statusW = nil, nil
	data, _ := json.Marshal(h.spec)
	_, werr := h.specW.Write(data)
	h.specW.Close()
	h.specW = nil
	msg, _ := io.ReadAll(io.LimitReader(h.statusR, 4096))
	if len(msg) == 0 && werr == nil {
		return nil
	}
	<-c.done // the helper exits right after reporting
	if len(msg) == 0 {
		return fmt.Errorf("%w: send spec to helper: %w", ErrStart, werr)
	}
	return fmt.Errorf("%w: helper: %s", ErrStart, msg)
}

func (h *helperLaunch) close() {
	for _, f := range []*os.File{h.specR, h.specW, h.statusR, h.statusW, h.ruleset} {
		if f != nil {
			f.Close()
		}
	}
}

// HelperMain is the helper's whole life: restrict itself, become the
// grant's user, re-arm the parent-death signal that setuid cleared, and
// execute the command. It never returns; on failure it reports on the
// status descriptor and exits 127.
func HelperMain() {
	err := helperRun()
	status := os.NewFile(helperStatusFD, "status")
	fmt.Fprintf(status, "%v", err)
	os.Exit(127)
}

// WARNING: order-sensitive; runs on the main thread, which spawn's init
// locked. Restrictions first (they need SETPCAP), then setgroups, setgid,
// setuid, then verification, then the parent-death signal, then the
// seccomp filter on every thread (TSYNC; it needs no_new_privs, set by
// restrictSelf), so nothing the helper does but its exec runs under it.
// Tested as root by
//
//	go test -race -run 'TestChildMasks/helper|TestHelper|TestSeccomp' ./receiver/spawn/
func helperRun() error {
	spec, err := readHelperSpec()
	if err != nil {
		return err
	}
	unix.CloseOnExec(helperStatusFD)
	if err := unix.Fchdir(helperDirFD); err != nil {
		return fmt.Errorf("fchdir: %w", err)
	}
	unix.Close(helperDirFD)
	unix.Umask(0o022)
	var rs *Ruleset
	if spec.Landlock {
		rs = &Ruleset{fd: helperRulesetFD}
	}
	if err := restrictSelf(rs); err != nil {
		return err
	}
	rs.Close()
	if err := becomeUser(spec); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("re-arm the parent-death signal: %w", err)
	}
	if len(spec.Seccomp) > 0 {
		f, err := filterFromBytes(spec.Seccomp)
		if err != nil {
			return err
		}
		if err := f.installAllThreads(); err != nil {
			return err
		}
	}
	if ppid := os.Getppid(); ppid != spec.ParentPID {
		return fmt.Errorf("parent %d is gone (parent is now %d)", spec.ParentPID, ppid)
	}
	err = syscall.Exec(spec.Path, spec.Argv, spec.Env)
	return fmt.Errorf("execute %s: %w", spec.Path, err)
}

func readHelperSpec() (helperSpec, error) {
	f := os.NewFile(helperSpecFD, "spec")
	defer f.Close()
	var spec helperSpec
	if err := strictjson.Read(f, maxHelperSpec, &spec); err != nil {
		return helperSpec{}, fmt.Errorf("decode spec: %w", err)
	}
	s := Spec{Path: spec.Path, Argv: spec.Argv, Env: spec.Env, UID: spec.UID, GID: spec.GID,
		Groups: spec.Groups, Dir: os.Stdin, Output: os.Stdout}
	if err := s.validate(); err != nil {
		return helperSpec{}, err
	}
	return spec, nil
}

// becomeUser sets groups, gid and uid on the calling thread alone, then
// verifies all its real, effective and saved ids and its groups.
//
// WARNING: per thread on purpose. The helper's main goroutine is locked to
// the main thread (spawn's init), which restricted itself alone
// (restrictSelf: the bounding, ambient and inheritable sets, no_new_privs
// and Landlock are per thread) and is the thread that executes the
// command; execve ends every other thread of the helper (runtime threads
// that run none of its code) before the command's first instruction. Go's
// syscall.Setresuid instead stops every thread to change it too, spinning
// in sched_yield until each has: three such rounds per command were 44% of
// the helper's CPU (docs/performance.md, run G). Tested as root by
//
//	go test -race -run 'TestChildMasks/helper|TestHelper|TestSeccomp' ./receiver/spawn/
func becomeUser(spec helperSpec) error {
	groups := slices.Clone(spec.Groups)
	var gp unsafe.Pointer
	if len(groups) > 0 {
		gp = unsafe.Pointer(&groups[0])
	}
	_, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(gp), 0)
	runtime.KeepAlive(groups)
	if e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	g, u := uintptr(spec.GID), uintptr(spec.UID)
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, g, g, g); e != 0 {
		return fmt.Errorf("setresgid %d: %w", spec.GID, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, u, u, u); e != 0 {
		return fmt.Errorf("setresuid %d: %w", spec.UID, e)
	}
	return checkUser(spec)
}

// checkUser verifies the calling thread's real, effective and saved ids
// and its groups against spec.
func checkUser(spec helperSpec) error {
	ru, eu, su := unix.Getresuid()
	rg, eg, sg := unix.Getresgid()
	got, err := unix.Getgroups()
	if err != nil {
		return fmt.Errorf("getgroups: %w", err)
	}
	want := make([]int, len(spec.Groups))
	for i, g := range spec.Groups {
		want[i] = int(g)
	}
	wantU, wantG := int(spec.UID), int(spec.GID)
	slices.Sort(got)
	slices.Sort(want)
	if ru != wantU || eu != wantU || su != wantU || rg != wantG || eg != wantG || sg != wantG || !slices.Equal(got, slices.Compact(want)) {
		return errors.New("credentials did not change as requested")
	}
	return nil
}
