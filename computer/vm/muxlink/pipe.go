package muxlink

import (
	"io"
	"sync"
)

// Join copies between a and b both ways until either side ends, then
// closes both; it returns when both copies have stopped.
func Join(a, b io.ReadWriteCloser) {
	var wg sync.WaitGroup
	var once sync.Once
	stop := func() { once.Do(func() { a.Close(); b.Close() }) }
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(a, b); stop() }()
	go func() { defer wg.Done(); _, _ = io.Copy(b, a); stop() }()
	wg.Wait()
}
