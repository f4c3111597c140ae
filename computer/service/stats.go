package service

// Stats is one reading of the service, for metrics.
type Stats struct {
	ByState         map[string]int // computers by state (deleted and failed included)
	Queued          int            // creates waiting for capacity
	Used            int            // capacity slots held, pool machines included
	UsedMemoryBytes int64          // committed memory, pool machines included
	PoolReady       map[string]int // ready machines by profile name
}

// Stats reads the service's counters under one lock.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{ByState: map[string]int{}, Queued: s.queue.len(), Used: s.used, UsedMemoryBytes: s.usedMem,
		PoolReady: map[string]int{}}
	for _, c := range s.computers {
		st.ByState[c.rec.State]++
	}
	for _, p := range s.pools {
		st.PoolReady[p.Name] = len(p.ready)
	}
	return st
}
