package service

import (
	"context"

	"github.com/tetherdev/tether/computer/api"
)

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

// Usage reads the cgroups of every running or suspended computer, for
// the metrics' scrape. A computer in the middle of a transition (its op
// lock held) is left out of this reading rather than waited for.
func (s *Service) Usage(ctx context.Context) map[string]api.Usage {
	s.mu.Lock()
	live := make(map[string]*computer, len(s.computers))
	for id, c := range s.computers {
		if st := c.rec.State; st == api.StateRunning || st == api.StateSuspended {
			live[id] = c
		}
	}
	s.mu.Unlock()
	out := make(map[string]api.Usage, len(live))
	for id, c := range live {
		if !c.op.TryLock() {
			continue
		}
		if c.m != nil {
			if u, err := c.m.Usage(ctx); err == nil {
				out[id] = u
			}
		}
		c.op.Unlock()
	}
	return out
}
