package spawn

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkFilterInstall is the cost of installing the filter on a fresh
// thread (which then ends), against the same thread without it: the
// kernel runs the filter for every system call number when it is
// installed (its allow cache), so the search's depth, not the program's
// length, sets it.
func BenchmarkFilterInstall(b *testing.B) {
	f := seccompFilter(b)
	for _, install := range []bool{false, true} {
		name := "without"
		if install {
			name = "with"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				done := make(chan error)
				go func() {
					runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
					if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
						done <- err
						return
					}
					if install {
						done <- f.installThread()
						return
					}
					done <- nil
				}()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
