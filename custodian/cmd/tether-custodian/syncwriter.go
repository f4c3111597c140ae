package main

import (
	"io"
	"sync"
)

// syncWriter makes each Write to w whole and serial: run's stderr is
// written by the custodian's log, the jail and the agent's stderr copy,
// each on its own goroutine.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
