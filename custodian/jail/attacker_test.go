package jail

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary is also the attacker: an agent-like program that the
// integration tests run inside a jail (TestMain dispatches on these
// variables, which the jail passes through in the agent's environment).
const (
	envAttack  = "TETHER_JAIL_TEST_ATTACK"  // JSON plan: run the attack, print a report
	envPayload = "TETHER_JAIL_TEST_PAYLOAD" // a file to create: proves a copied binary ran
)

// plan tells the attacker what to try; paths come from the test.
type plan struct {
	Token       string   `json:"token"`
	Stat        []string `json:"stat"`
	List        []string `json:"list"`
	Write       []string `json:"write"`
	HostPid     int      `json:"host_pid"`
	HostToken   string   `json:"host_token"`
	Abstract    string   `json:"abstract"`
	TCP         string   `json:"tcp"`
	ExecVisible string   `json:"exec_visible"`
	// Loader is a dynamic loader in the jail's exec allowlist, and
	// LoaderTarget a dynamic program it loads (see loaderTarget): the
	// attacker runs a copy of LoaderTarget in /tmp through Loader, and
	// LoaderTarget itself as the positive control.
	Loader       string `json:"loader"`
	LoaderTarget string `json:"loader_target"`
}

// report is what the attacker saw. Errors are errno names ("ENOENT"),
// "ok" for success.
type report struct {
	Status       map[string]string   `json:"status"`
	Stat         map[string]string   `json:"stat"`
	List         map[string][]string `json:"list"`
	ListErr      map[string]string   `json:"list_err"`
	Write        map[string]string   `json:"write"`
	Cwd          string              `json:"cwd"`
	ShellExit    int                 `json:"shell_exit"`
	ShellStderr  string              `json:"shell_stderr"`
	ShellPwned   bool                `json:"shell_pwned"`
	ExecHome     string              `json:"exec_home"`
	ExecTmp      string              `json:"exec_tmp"`
	SelfInterp   string              `json:"self_interp"` // the attacker's own PT_INTERP, "" when static
	LoaderTmp    string              `json:"loader_tmp"`
	PayloadRan   bool                `json:"payload_ran"`
	LoaderDirect string              `json:"loader_direct"`
	DirectRan    bool                `json:"direct_ran"`
	ExecVisible  string              `json:"exec_visible"`
	KillHost     string              `json:"kill_host"`
	PtraceHost   string              `json:"ptrace_host"`
	KillInit     string              `json:"kill_init"`
	PtraceInit   string              `json:"ptrace_init"`
	HostInProc   bool                `json:"host_in_proc"`
	InitFds      map[string]string   `json:"init_fds"`
	ProcHost     string              `json:"proc_host"`
	Abstract     string              `json:"abstract"`
	TCP          string              `json:"tcp"`
	Markers      []string            `json:"markers"`
}

// errName names err's errno, "ok" for nil.
func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return "exit " + strings.TrimPrefix(ee.ProcessState.String(), "exit status ")
	}
	return err.Error()
}

// payloadMain is a copied binary that ran: it leaves its mark.
func payloadMain(path string) int {
	os.WriteFile(path, []byte("ran"), 0o644)
	return 0
}

// attackMain runs the plan and prints the report on stdout, then leaves
// two markers and waits for stdin to close, so the test can look at HOME
// and /tmp from outside while the jail still runs.
func attackMain(planJSON string) int {
	var p plan
	if err := json.Unmarshal([]byte(planJSON), &p); err != nil {
		os.Stderr.WriteString("attacker: bad plan: " + err.Error() + "\n")
		return 2
	}
	r := &report{Stat: map[string]string{}, List: map[string][]string{}, ListErr: map[string]string{}, Write: map[string]string{}}
	r.Status = selfStatus()
	r.Cwd, _ = os.Getwd()
	for _, s := range p.Stat {
		_, err := os.Lstat(s)
		r.Stat[s] = errName(err)
	}
	for _, d := range p.List {
		names, err := listNames(d)
		r.List[d], r.ListErr[d] = names, errName(err)
	}
	for _, w := range p.Write {
		r.Write[w] = errName(os.WriteFile(w, []byte("x"), 0o644))
	}
	attackExec(&p, r)
	attackProcesses(&p, r)
	attackNetwork(&p, r)
	for _, m := range []string{filepath.Join(os.Getenv("HOME"), "marker-"+p.Token), filepath.Join(os.TempDir(), "marker-"+p.Token)} {
		if err := os.WriteFile(m, []byte("x"), 0o600); err == nil {
			r.Markers = append(r.Markers, m)
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 2
	}
	io.Copy(io.Discard, os.Stdin)
	return 0
}

func selfStatus() map[string]string {
	out := map[string]string{}
	data, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func listNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	names := []string{}
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, err
}

// attackExec runs a shell, a copy of itself written to HOME and /tmp,
// a copy of the plan's dynamic program in /tmp through its loader (and,
// as the positive control, the program itself through the loader), and a
// visible program that is not on the allowlist.
func attackExec(p *plan, r *report) {
	home := os.Getenv("HOME")
	var stderr bytes.Buffer
	sh := exec.Command("/bin/sh", "-c", "echo pwned > "+home+"/pwned-sh")
	sh.Stderr = io.MultiWriter(&stderr, os.Stderr) // the jail's stderr too, as an agent's would
	err := sh.Run()
	r.ShellExit = sh.ProcessState.ExitCode()
	if err != nil && sh.ProcessState == nil {
		r.ShellExit = -1
		r.ShellStderr = errName(err)
	} else {
		r.ShellStderr = stderr.String()
	}
	_, err = os.Stat(filepath.Join(home, "pwned-sh"))
	r.ShellPwned = err == nil
	self, _ := os.ReadFile("/proc/self/exe")
	mark := filepath.Join(home, "payload-ran")
	run := func(path string, args ...string) string { return runMarking(mark, path, args...) }
	for _, dst := range []struct {
		path string
		res  *string
	}{{filepath.Join(home, "copy"), &r.ExecHome}, {filepath.Join(os.TempDir(), "copy"), &r.ExecTmp}} {
		if err := os.WriteFile(dst.path, self, 0o755); err != nil {
			*dst.res = "write: " + errName(err)
			continue
		}
		*dst.res = run(dst.path)
	}
	r.SelfInterp, _ = elfInterpOf("/proc/self/exe")
	if p.Loader != "" {
		r.LoaderTmp = attackLoader(p, mark)
		direct := filepath.Join(home, "direct-ran")
		r.LoaderDirect = runMarking(direct, p.Loader, p.LoaderTarget, direct)
		_, err = os.Stat(direct)
		r.DirectRan = err == nil
	}
	if p.ExecVisible != "" {
		r.ExecVisible = run(p.ExecVisible)
	}
	_, err = os.Stat(mark)
	r.PayloadRan = err == nil
}

// runMarking runs path with args, telling it to create mark if it runs:
// this test binary creates the file its payload variable names, and
// loaderTarget's other program (touch) creates its last argument.
func runMarking(mark, path string, args ...string) string {
	c := exec.Command(path, args...)
	c.Env = append(os.Environ(), envAttack+"=", envPayload+"="+mark)
	return errName(c.Run())
}

// attackLoader copies the plan's dynamic program to /tmp and runs the
// copy through the loader, which must fail to map it (/tmp is noexec).
func attackLoader(p *plan, mark string) string {
	data, err := os.ReadFile(p.LoaderTarget)
	if err != nil {
		return "read: " + errName(err)
	}
	cp := filepath.Join(os.TempDir(), "loader-copy")
	if err := os.WriteFile(cp, data, 0o755); err != nil {
		return "write: " + errName(err)
	}
	return runMarking(mark, p.Loader, cp, mark)
}

// elfInterpOf returns the PT_INTERP of the ELF file at path: its dynamic
// loader, "" for a static binary.
func elfInterpOf(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			data, err := io.ReadAll(prog.Open())
			return string(bytes.TrimRight(data, "\x00")), err
		}
	}
	return "", nil
}

// attackProcesses signals and traces a host process and the jail's own
// pid 1 (bwrap's init, outside the agent's Landlock domain), and looks
// for the host process in /proc.
func attackProcesses(p *plan, r *report) {
	r.KillHost = errName(unix.Kill(p.HostPid, 0))
	r.PtraceHost = errName(unix.PtraceAttach(p.HostPid))
	r.KillInit = errName(unix.Kill(1, 0))
	r.PtraceInit = errName(unix.PtraceAttach(1))
	_, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.HostPid), "cmdline"))
	r.ProcHost = errName(err)
	r.InitFds = map[string]string{}
	fds, _ := os.ReadDir("/proc/1/fd")
	for _, fd := range fds {
		f, err := os.Open(filepath.Join("/proc/1/fd", fd.Name()))
		if f != nil {
			f.Close()
		}
		r.InitFds[fd.Name()] = errName(err)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(data, []byte(p.HostToken)) {
			r.HostInProc = true
		}
	}
}

// attackNetwork connects to a host abstract unix socket and a host
// loopback TCP port.
func attackNetwork(p *plan, r *report) {
	if p.Abstract != "" {
		c, err := net.DialTimeout("unix", "@"+p.Abstract, 2*time.Second)
		if c != nil {
			c.Close()
		}
		r.Abstract = errName(err)
	}
	if p.TCP != "" {
		c, err := net.DialTimeout("tcp", p.TCP, 2*time.Second)
		if c != nil {
			c.Close()
		}
		r.TCP = errName(err)
	}
}
