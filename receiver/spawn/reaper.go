package spawn

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// reg is the registry of live children and the reaper's state. Forks hold
// mu for reading from fork to registration; the reaper reaps under mu for
// writing, so it never mistakes a child that is being registered for an
// orphan, and Child.Signal never signals a reaped group.
var reg = struct {
	mu       sync.RWMutex
	mapMu    sync.Mutex // guards children: forks register concurrently under mu.RLock
	children map[int]*Child
	once     sync.Once
	wake     chan struct{}
}{children: map[int]*Child{}, wake: make(chan struct{}, 1)}

func register(c *Child) {
	reg.mapMu.Lock()
	reg.children[c.pid] = c
	reg.mapMu.Unlock()
}

// unregister returns the registered child of pid, removing it.
func unregister(pid int) *Child {
	reg.mapMu.Lock()
	defer reg.mapMu.Unlock()
	c := reg.children[pid]
	delete(reg.children, pid)
	return c
}

func registered(pid int) *Child {
	reg.mapMu.Lock()
	defer reg.mapMu.Unlock()
	return reg.children[pid]
}

// startReaper makes the process a child subreaper (orphaned descendants of
// a child are reparented to the receiver, not to an init that may never
// reap them) and starts the one goroutine that waits for every child.
func startReaper() {
	reg.once.Do(func() {
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
		go reapLoop()
	})
}

func wakeReaper() {
	select {
	case reg.wake <- struct{}{}:
	default:
	}
}

// sigchldInfo is the SIGCHLD layout of siginfo_t on 64-bit Linux: si_pid
// follows signo, errno, code and padding.
type sigchldInfo struct {
	Signo, Errno, Code int32
	_                  int32
	Pid                int32
	UID                uint32
	Status             int32
	_                  [100]byte
}

// The kernel writes 128 bytes of siginfo_t.
var _ [128 - unsafe.Sizeof(sigchldInfo{})]byte
var _ [unsafe.Sizeof(sigchldInfo{}) - 128]byte

// reapLoop peeks at the next exited child without reaping it (WNOWAIT),
// then reaps it under the registry lock. For a registered child it first
// sends SIGKILL to the child's process group, while the un-reaped zombie
// still pins the pgid, and to its cgroup (Spec.Cgroup): nothing a command
// left behind in its group, or in its cgroup after leaving the group,
// outlives it. Unregistered children are orphans reparented to this subreaper.
func reapLoop() {
	for {
		var info sigchldInfo
		err := unix.Waitid(unix.P_ALL, 0, (*unix.Siginfo)(unsafe.Pointer(&info)), unix.WEXITED|unix.WNOWAIT, nil)
		switch {
		case err == unix.ECHILD:
			<-reg.wake // no children at all: sleep until the next fork
			continue
		case err == unix.EINTR || err == nil && info.Pid == 0:
			continue
		case err != nil:
			panic("spawn: waitid: " + err.Error()) // EINVAL/EFAULT: a bug, never a runtime condition
		}
		reapOne(int(info.Pid))
	}
}

func reapOne(pid int) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	// Re-check under the lock: pid must still be an exited, un-reaped child
	// (Go's own fork error path may have reaped it meanwhile).
	var info sigchldInfo
	err := unix.Waitid(unix.P_PID, pid, (*unix.Siginfo)(unsafe.Pointer(&info)), unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
	if err != nil || info.Pid == 0 {
		return
	}
	if c := registered(pid); c != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = c.killCgroup() // descendants that left the group; a failure leaves them to the cgroup's owner
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err != nil {
		return
	}
	if c := unregister(pid); c != nil {
		c.finish(ws)
	}
}

// lastCap is the highest capability number the kernel knows.
var lastCap = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 63
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 63 {
		return 63
	}
	return n
})
