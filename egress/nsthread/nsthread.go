// Package nsthread runs a function on an OS thread that has joined
// another network namespace, and brings the thread back afterwards. The
// sockets the function opens keep the namespace they were made in, so
// ordinary goroutines serve them later. Its callers: the namespaced
// provisioner (a computer's egress listener), egress/labnet (the demo's
// small internet).
package nsthread

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// In runs f on a fresh goroutine locked to its OS thread, after that
// thread joins the network namespace fd names (a pidfd, or an open
// namespace file; In does not close it), or a new namespace when fd is
// negative. After f the thread joins its own namespace again and is
// unlocked. Should that return fail, the thread stays locked and the
// runtime ends it with the goroutine, and In reports the failure.
//
// Ending the thread alone is not enough: when the goroutine happens to
// run on the process's main thread, the runtime parks that thread for
// good instead of ending it, and the parked thread would hold the
// namespace alive. TestInReturns checks the thread comes back.
//
// f must not start goroutines that expect to stay in the namespace:
// only the locked thread is in it.
func In(fd int, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err, back := onThread(fd, f)
		if back {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// onThread runs on the locked thread; back says the thread is in its
// first namespace again when it returns.
func onThread(fd int, f func() error) (err error, back bool) {
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("nsthread: open this thread's network namespace: %w", err), true
	}
	defer orig.Close()
	if fd < 0 {
		err = unix.Unshare(unix.CLONE_NEWNET)
	} else {
		err = unix.Setns(fd, unix.CLONE_NEWNET)
	}
	if err != nil {
		// The thread is where it was: a failed unshare or setns
		// changes nothing.
		return fmt.Errorf("nsthread: join the network namespace: %w", err), true
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, fmt.Errorf("nsthread: return to the thread's network namespace: %w", err)), false
	}
	return ferr, true
}

// LoopbackUp sets IFF_UP on lo in the calling thread's network
// namespace: the one interface a fresh namespace has, down at first.
// Call it from f (or a thread that unshared its namespace itself).
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("nsthread: lo up: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("nsthread: lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("nsthread: lo up: SIOCGIFFLAGS: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("nsthread: lo up: SIOCSIFFLAGS: %w", err)
	}
	return nil
}
