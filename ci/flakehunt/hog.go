package flakehunt

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// startHog starts n busy loops beside the hunt: the load of a machine
// shared with other work, which is when timing-dependent tests fail. Each
// loop spins on its own locked OS thread, and GOMAXPROCS is raised by n
// while they run, so the hunt's own goroutines keep their processors.
// The loops are threads of this process, so they end with it even if it
// is killed. The caller calls stop once: it ends the loops, waits until
// they have ended and restores GOMAXPROCS. n 0 starts nothing.
func startHog(n int) (stop func()) {
	if n <= 0 {
		return func() {}
	}
	prev := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(prev + n)
	var done atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for !done.Load() {
			}
		}()
	}
	return func() {
		done.Store(true)
		wg.Wait()
		runtime.GOMAXPROCS(prev)
	}
}
