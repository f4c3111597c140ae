package spawn

import (
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openDevNull opens /dev/null once for every child's stdin: a read-only
// descriptor that is never closed and never changes.
var openDevNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })

// openPidfd returns a non-blocking pidfd of the child pid, registered with
// the runtime's poller, or nil when the kernel has no pidfd_open (Reap then
// waits for the reaper). The caller holds reg.mu, so pid is still the
// child's (an exited child stays a zombie until it is reaped under the
// write lock).
func openPidfd(pid int) *os.File {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), "pidfd")
}

// Reap blocks until the child has exited and has been reaped, then
// returns (Done is closed by then). The wait goes through the runtime's
// poller on the child's pidfd, so the goroutine that calls Reap is woken
// by the child's exit itself rather than handed the news by the reaper
// goroutine; it then reaps the child exactly as the reaper would (SIGKILL
// to the whole group first, under the same lock), unless the reaper got
// there first. Safe to call from several goroutines; the first to see the
// exit reaps.
func (c *Child) Reap() {
	if f := c.pidfd; f != nil {
		if rc, err := f.SyscallConn(); err == nil && waitExited(rc) {
			reapOne(c.pid)
		}
	}
	<-c.done
}

// waitExited waits on a pidfd until its process has exited. It reports
// false if the process is already reaped or the pidfd was closed (Done is
// or is about to be closed then).
func waitExited(rc syscall.RawConn) bool {
	exited := false
	err := rc.Read(func(fd uintptr) bool {
		for {
			var info sigchldInfo
			err := unix.Waitid(unix.P_PIDFD, int(fd), (*unix.Siginfo)(unsafe.Pointer(&info)),
				unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
			switch {
			case err == unix.EINTR:
				continue
			case err == nil && info.Pid == 0:
				return false // still running: wait for the pidfd to become readable
			}
			exited = err == nil
			return true // exited, or already reaped (ECHILD)
		}
	})
	return err == nil && exited
}
