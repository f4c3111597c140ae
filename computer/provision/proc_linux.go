package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/syndtr/gocapability/capability"
	"golang.org/x/sys/unix"
)

// ProcessesOf lists the processes whose uid (the first of real, effective
// and saved that is not root) is uid, from /proc; with uid 0, those
// running as root. Processes that vanish while being read are skipped.
func ProcessesOf(uid uint32) ([]Process, error) {
	all, err := AllProcesses()
	var out []Process
	for _, p := range all {
		if p.UID == uid {
			out = append(out, p)
		}
	}
	return out, err
}

// uidInUse reports whether any process runs as uid, as ProcessesOf
// counts it, stopping at the first (pidsOf).
func uidInUse(uid uint32) (bool, error) {
	pids, err := pidsOf(uid, true)
	return len(pids) > 0, err
}

// pidsOf lists the processes ProcessesOf lists, by host pid alone, from
// each process's status only (ProcessesOf also reads every command
// line): the checks that run once per computer on a host of many
// computers (FreshID, KillCommands, teardown, NothingLeft). With first it
// stops at the first. Processes that vanish while being read are
// skipped.
func pidsOf(uid uint32, first bool) ([]int, error) {
	f, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, err
	}
	var out []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		status, err := os.ReadFile("/proc/" + n + "/status")
		if err != nil {
			continue // gone meanwhile
		}
		if parseStatus(pid, status).UID == uid {
			if out = append(out, pid); first {
				break
			}
		}
	}
	return out, nil
}

// AllProcesses lists every process, from /proc, as this process sees
// them (PID is HostPID), with NSPID set.
func AllProcesses() ([]Process, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Process
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			if p, ok := readProcess(pid); ok {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// innerView returns ps with PID and PPID as their own PID namespace sees
// them (a namespaced computer's processes as its receiver reports them);
// a parent outside that namespace becomes 0. all maps every process.
func innerView(ps, all []Process) []Process {
	inner := make(map[int]int, len(all))
	for _, p := range all {
		inner[p.HostPID] = p.NSPID
	}
	out := make([]Process, len(ps))
	for i, p := range ps {
		out[i] = p
		if p.NSPID != p.HostPID {
			out[i].PID, out[i].PPID = p.NSPID, inner[p.PPID]
		}
	}
	return out
}

// readProcess reads one process's uid (the first of real, effective, saved
// that is not root, else root), name and command line.
func readProcess(pid int) (Process, bool) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Process{}, false
	}
	p := parseStatus(pid, status)
	if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		for _, a := range bytes.Split(bytes.TrimRight(cl, "\x00"), []byte{0}) {
			p.Cmdline = append(p.Cmdline, string(a))
		}
	}
	return p, true
}

// parseStatus reads pid's uid (the first of real, effective, saved that
// is not root, else root), name, parent and innermost pid from its
// /proc/PID/status.
func parseStatus(pid int, status []byte) Process {
	p := Process{PID: pid, HostPID: pid, NSPID: pid, UID: 0}
	for rest := string(status); rest != ""; {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "NSpid":
			if f := strings.Fields(v); len(f) > 0 {
				p.NSPID, _ = strconv.Atoi(f[len(f)-1])
			}
		case "Name":
			p.Comm = strings.TrimSpace(v)
		case "PPid":
			p.PPID, _ = strconv.Atoi(strings.TrimSpace(v))
		case "Uid":
			ids := strings.Fields(v)
			for _, f := range ids[:min(3, len(ids))] {
				if u, err := strconv.ParseUint(f, 10, 32); err == nil && u != 0 {
					p.UID = uint32(u)
					break
				}
			}
		}
	}
	return p
}

// StartTicks returns field 22 of /proc/PID/stat: when the process started,
// in clock ticks since boot. With the pid it names one process for good,
// so a recycled pid is never signalled by mistake.
func StartTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStartTicks(b)
}

// parseStartTicks reads field 22 (starttime) of a /proc/PID/stat line.
// The second field, the command name, may hold spaces and parentheses,
// so fields are counted from its last closing parenthesis.
func parseStartTicks(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("stat: %d fields after the command name, want at least 20", len(f))
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22 overall
}

// Alive reports whether pid is still the process that started at ticks
// (a zombie counts as gone).
func Alive(pid int, ticks uint64) bool {
	t, err := StartTicks(pid)
	if err != nil || t != ticks {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// waitGone polls until pid (started at ticks) is gone or ctx ends.
func waitGone(ctx context.Context, pid int, ticks uint64) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for Alive(pid, ticks) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("process %d still running: %w", pid, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// signal sends sig to pid only if it is still the process that started at
// ticks.
func signal(pid int, ticks uint64, sig syscall.Signal) error {
	if !Alive(pid, ticks) {
		return nil
	}
	err := syscall.Kill(pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// capByName maps "KILL" or "CAP_KILL" (any case) to the capability.
func capByName(name string) (capability.Cap, error) {
	n := strings.TrimPrefix(strings.ToLower(name), "cap_")
	for c := capability.Cap(0); c <= capability.CAP_LAST_CAP; c++ {
		if c.String() == n {
			return c, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown capability %q", ErrOptions, name)
}

// StartWithout starts cmd with the named capabilities ("KILL") removed
// from its bounding set, as startReduced does: how tests run a program on
// a reduced worker. cmd must not set Pdeathsig.
func StartWithout(cmd *exec.Cmd, caps ...string) error {
	var drop []capability.Cap
	for _, n := range caps {
		c, err := capByName(n)
		if err != nil {
			return err
		}
		drop = append(drop, c)
	}
	return startReduced(cmd, drop)
}

// startReduced starts cmd with every capability in drop removed from its
// bounding set, as a receiver on a reduced worker would be started. The
// bounding set is per thread and inherited across fork, so the drop
// happens on a goroutine locked to its own OS thread that forks cmd and
// then ends still locked: the runtime destroys that thread instead of
// reusing it, so no other goroutine ever runs with a reduced set.
// cmd must not set Pdeathsig: the spawning thread dies right after.
//
// WARNING: order-sensitive; tested as root by
// `go test -race -run TestIntegrationReducedWorker ./fixtures/computer`.
func startReduced(cmd *exec.Cmd, drop []capability.Cap) error {
	if len(drop) == 0 {
		return cmd.Start()
	}
	if cmd.SysProcAttr != nil && cmd.SysProcAttr.Pdeathsig != 0 {
		return fmt.Errorf("%w: a reduced receiver cannot have a parent-death signal", ErrOptions)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread is discarded
		for _, c := range drop {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				errc <- fmt.Errorf("drop %s from the bounding set: %w", strings.ToUpper(c.String()), err)
				return
			}
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// HostPID translates pid, as the computer's receiver reports it (in its
// own PID namespace on a namespaced computer), to this process's pid
// namespace; on a computer without namespaces it is pid itself.
func (c *Local) HostPID(pid int) (int, error) {
	s := c.State()
	if !s.namespaced() {
		return pid, nil
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", s.ReceiverPID))
	if err != nil {
		return 0, fmt.Errorf("the receiver's PID namespace: %w", err)
	}
	all, err := AllProcesses()
	if err != nil {
		return 0, err
	}
	for _, p := range all {
		if p.NSPID != pid {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.HostPID)); err == nil && l == ns {
			return p.HostPID, nil
		}
	}
	return 0, fmt.Errorf("no process %d in the computer's PID namespace %s", pid, ns)
}
