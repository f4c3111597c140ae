package service

import (
	"context"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// poolRetry is how long the refill waits after a failed Prepare.
const poolRetry = 5 * time.Second

// pool is the warm pool of one profile: machines Prepared (no grant yet)
// that hold their capacity. Guarded by Service.mu.
type pool struct {
	Profile
	ready     []api.Machine
	preparing int
}

func (s *Service) poolFor(l api.Limits) *pool {
	for _, p := range s.pools {
		if p.Limits == l {
			return p
		}
	}
	return nil
}

func (s *Service) poolReadyLocked(l api.Limits) bool {
	p := s.poolFor(l)
	return p != nil && len(p.ready) > 0
}

// claimLocked takes a ready machine of l's profile; its capacity passes
// to the computer. Nil when none is ready.
func (s *Service) claimLocked(l api.Limits) api.Machine {
	p := s.poolFor(l)
	if p == nil || len(p.ready) == 0 {
		return nil
	}
	m := p.ready[0]
	p.ready = p.ready[1:]
	return m
}

// returnToPoolLocked puts back a claimed machine that was never granted.
func (s *Service) returnToPoolLocked(l api.Limits, m api.Machine) {
	s.poolFor(l).ready = append(s.poolFor(l).ready, m)
}

// PoolReady says how many machines are ready in each profile's pool.
func (s *Service) PoolReady() map[string]int { return s.Stats().PoolReady }

// evictForQueueLocked gives back the capacity of one ready pool machine
// when a queued request of another profile would then fit (pool machines
// never keep a real request waiting). The machine is closed in the
// background. It reports whether it evicted one.
func (s *Service) evictForQueueLocked() bool {
	var free int
	var freeMem int64
	for _, p := range s.pools {
		free += len(p.ready)
		freeMem += int64(len(p.ready)) * p.Limits.MemoryBytes
	}
	if free == 0 || s.closed {
		return false
	}
	for _, o := range s.queue.owners {
		w := s.queue.subs[o][0]
		if s.fitsWithoutLocked(w.limits, s.evicting, s.evictingMem) {
			return false // the machines being closed make room: wait for them
		}
		if s.fitsWithoutLocked(w.limits, s.evicting+free, s.evictingMem+freeMem) {
			s.evictOneLocked()
			return true
		}
	}
	return false
}

// fitsWithoutLocked says whether l would fit with n machines and mem
// bytes of capacity given back.
func (s *Service) fitsWithoutLocked(l api.Limits, n int, mem int64) bool {
	s.used, s.usedMem = s.used-n, s.usedMem-mem
	fits := s.fitsLocked(l)
	s.used, s.usedMem = s.used+n, s.usedMem+mem
	return fits
}

func (s *Service) evictOneLocked() {
	for _, p := range s.pools {
		if len(p.ready) == 0 {
			continue
		}
		m := p.ready[len(p.ready)-1]
		p.ready = p.ready[:len(p.ready)-1]
		// Its capacity is given back only once it is gone: until then it
		// still runs, and the host's cap counts what runs.
		s.evicting, s.evictingMem = s.evicting+1, s.evictingMem+p.Limits.MemoryBytes
		s.wg.Add(1)
		go func(l api.Limits) {
			defer s.wg.Done()
			s.closePooled(m)
			s.mu.Lock()
			defer s.mu.Unlock()
			s.evicting, s.evictingMem = s.evicting-1, s.evictingMem-l.MemoryBytes
			s.releaseLocked(l)
			s.dispatchLocked()
		}(p.Limits)
		return
	}
}

// closePooled ends a pool machine that was never granted: Close, or
// Destroy when Close fails; then its pool record goes.
func (s *Service) closePooled(m api.Machine) {
	ctx := context.WithoutCancel(s.ctx)
	if err := m.Close(ctx); err != nil {
		s.prov.Destroy(ctx, m.Dir())
	}
	s.st.delPool(m.Dir())
}

func (s *Service) kickRefill() {
	select {
	case s.refill <- struct{}{}:
	default:
	}
}

// refillLoop prepares pool machines while a pool is short, capacity is
// free and no create waits in the queue (a waiting create comes first).
func (s *Service) refillLoop() {
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.refill:
		}
		for s.ctx.Err() == nil {
			p := s.nextRefill()
			if p == nil {
				break
			}
			if !s.prepareOne(p) {
				s.goBackground(func() {
					select {
					case <-time.After(poolRetry):
						s.kickRefill()
					case <-s.ctx.Done():
					}
				})
				break
			}
		}
	}
}

// nextRefill holds capacity for one more machine of a short pool.
func (s *Service) nextRefill() *pool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.queue.len() > 0 {
		return nil
	}
	for _, p := range s.pools {
		if len(p.ready)+p.preparing < p.Size && s.fitsLocked(p.Limits) {
			s.holdLocked(p.Limits)
			p.preparing++
			return p
		}
	}
	return nil
}

// prepareOne records the pool machine's directory (its intent: a restart
// destroys it), prepares it, and adds it to the pool.
func (s *Service) prepareOne(p *pool) bool {
	dir := filepath.Join(s.cfg.Dir, "pool", newID(p.Name+"-"))
	err := s.st.putPool(dir)
	var m api.Machine
	if err == nil {
		m, err = s.prov.Prepare(s.ctx, dir, p.Limits)
		if err != nil {
			s.cfg.Logf("pool %s: prepare %s: %v", p.Name, dir, err)
			s.teardown(s.prov, nil, dir, "")
			s.st.delPool(dir)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p.preparing--
	if err != nil {
		s.releaseLocked(p.Limits)
		return false
	}
	p.ready = append(p.ready, m)
	s.dispatchLocked()
	return true
}
