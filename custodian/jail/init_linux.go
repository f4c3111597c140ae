package jail

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/strictjson"
)

// initSpec is what the custodian sends the init on initSpecFD.
type initSpec struct {
	Path   string   `json:"path"`
	Argv   []string `json:"argv"`
	Exec   []string `json:"exec"`
	Banner string   `json:"banner"`
	// NProc is the agent's RLIMIT_NPROC (soft and hard): jail.max_pids,
	// counted for the jail's own uid.
	NProc int64 `json:"nproc"`
	// DenyServe (network host) refuses TCP bind (Landlock) and listen,
	// Multipath TCP and io_uring (seccomp, serve_linux.go).
	DenyServe bool `json:"deny_serve"`
	// AllowListen leaves listen(2) out of that filter (Options.Listen).
	AllowListen bool `json:"allow_listen"`
}

// maxInitSpec bounds the spec the init reads.
const maxInitSpec = 1 << 20

// Landlock rights the init grants.
const (
	rightsRead  = landlock.AccessFSSet(ll.AccessFSReadFile | ll.AccessFSReadDir)
	rightsExec  = landlock.AccessFSSet(ll.AccessFSExecute | ll.AccessFSReadFile)
	rightsWrite = landlock.AccessFSSet(ll.AccessFSReadFile | ll.AccessFSReadDir | ll.AccessFSWriteFile |
		ll.AccessFSTruncate | ll.AccessFSRemoveFile | ll.AccessFSRemoveDir | ll.AccessFSMakeReg |
		ll.AccessFSMakeDir | ll.AccessFSMakeSym | ll.AccessFSMakeFifo | ll.AccessFSMakeSock)
	rightsDevice = landlock.AccessFSSet(ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev)
)

// writableDevices are the device files the agent may write.
var writableDevices = []string{"/dev/null", "/dev/zero", "/dev/full"}

// HelperMain runs the jail's init or its shell stub when this process is
// one of them, and returns otherwise. Call it first thing in main (and in
// TestMain of tests that start jails): inside a jail this binary is both.
func HelperMain() {
	if len(os.Args) > 1 && os.Args[1] == InitArg {
		os.Exit(initMain())
	}
	if exe, err := os.Executable(); err == nil && slices.Contains(StubPaths, exe) {
		os.Exit(stubMain(exe))
	}
}

// stubMain is a shell the agent tried to run: it runs nothing and says so.
func stubMain(exe string) int {
	fmt.Fprintf(os.Stderr, "tether jail: refused to run %s %s: the agent jail runs no shell and nothing outside its exec allowlist "+
		"(printed when the jail started); commands for the computer go through ACP terminal/*\n", exe, strings.Join(os.Args[1:], " "))
	return StubExit
}

// initMain reads its spec, prints the banner, restricts itself with
// Landlock and executes the agent. It returns only on failure.
//
// WARNING: thread-sensitive. landlock_restrict_self and no_new_privs are
// applied to the calling thread only, which then calls execve: the agent
// inherits exactly that thread's restrictions. The thread is locked first
// so both happen on the thread that executes. Tested as root by
//
//	go test -race -run 'TestIntegrationJail' ./custodian/jail/
func initMain() int {
	runtime.LockOSThread()
	spec, err := readInitSpec()
	if err != nil {
		fmt.Fprintf(os.Stderr, "tether jail: init: %v\n", err)
		return 127
	}
	fmt.Fprint(os.Stderr, spec.Banner)
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		fmt.Fprintf(os.Stderr, "tether jail: init: mark descriptors close-on-exec: %v\n", err)
		return 127
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: uint64(spec.NProc), Max: uint64(spec.NProc)}); err != nil {
		fmt.Fprintf(os.Stderr, "tether jail: init: set RLIMIT_NPROC %d: %v; the agent was not started\n", spec.NProc, err)
		return 127
	}
	if err := restrictExec(spec.Exec, spec.DenyServe, spec.AllowListen); err != nil {
		fmt.Fprintf(os.Stderr, "tether jail: init: %v; the agent was not started\n", err)
		return 127
	}
	err = syscall.Exec(spec.Path, spec.Argv, os.Environ())
	fmt.Fprintf(os.Stderr, "tether jail: cannot execute the agent's program %s: %v (exec inside the jail is limited to: %s)\n",
		spec.Path, err, strings.Join(spec.Exec, " "))
	if errors.Is(err, unix.ENOENT) {
		return 127
	}
	return 126
}

func readInitSpec() (*initSpec, error) {
	f := os.NewFile(initSpecFD, "jail-spec")
	if f == nil {
		return nil, errors.New("no spec descriptor")
	}
	defer f.Close()
	var s initSpec
	if err := strictjson.Read(f, maxInitSpec, &s); err != nil {
		return nil, fmt.Errorf("decode spec: %w", err)
	}
	if s.Path == "" || len(s.Argv) == 0 {
		return nil, errors.New("spec names no program")
	}
	if s.NProc < MinPids {
		return nil, fmt.Errorf("spec's nproc %d is below %d", s.NProc, MinPids)
	}
	return &s, nil
}

// restrictExec sets no_new_privs and enforces, on the calling thread, a
// Landlock ruleset that handles every file system right of ABI 6 and both
// of its scopes: everything the view shows is readable, HOME and /tmp are
// writable, a few devices are usable, and only exec is executable.
// Signals and abstract unix sockets cannot reach outside the jail. With
// denyServe it also handles TCP bind (ABI 4) with no port allowed, and
// installs the seccomp filter against serving on the host (installNoServe),
// which refuses listen(2) too unless allowListen.
func restrictExec(exec []string, denyServe, allowListen bool) error {
	cfg := landlock.Config{HandledAccessFS: landlock.V6.HandledAccessFS, Scoped: landlock.V6.Scoped}
	if denyServe {
		cfg.HandledAccessNet = landlock.AccessNetSet(ll.AccessNetBindTCP)
	}
	fd, _, err := cfg.NewRulesetFD(
		landlock.PathAccess(rightsRead, "/"),
		landlock.PathAccess(rightsWrite, Home, Tmp).WithRefer(),
		landlock.PathAccess(rightsDevice, writableDevices...).IgnoreIfMissing(),
		landlock.PathAccess(rightsExec, exec...),
	)
	if err != nil {
		return fmt.Errorf("%w: build the ruleset: %w", ErrLandlock, err)
	}
	defer unix.Close(fd)
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := ll.LandlockRestrictSelf(fd, 0); err != nil {
		return fmt.Errorf("%w: restrict: %w", ErrLandlock, err)
	}
	if denyServe {
		return installNoServe(allowListen)
	}
	return nil
}

// LandlockABI returns the kernel's Landlock ABI version, 0 without
// Landlock.
func LandlockABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}
