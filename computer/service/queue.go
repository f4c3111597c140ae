package service

import (
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// waiter is one create waiting for capacity.
type waiter struct {
	c        *computer
	owner    string
	limits   api.Limits
	admitted chan struct{} // closed when admitted; then held or pooled is set
	pooled   api.Machine   // a warm-pool machine claimed for it, if any
	tier     string        // the pool holds namespaced machines only
	done     bool          // admitted or removed
	pos      int           // last position reported
	cancel   chan string   // a delete while queued sends its reason
	left     chan struct{} // closed under c.op once it left the queue
}

// fairQueue holds one sub-queue per owner and serves the owners round
// robin, so one owner's burst waits behind every other owner's next
// request, not in front of it. Guarded by Service.mu.
type fairQueue struct {
	owners []string // ring of owners with a non-empty sub-queue
	next   int      // index in owners of the owner served next
	subs   map[string][]*waiter
}

func (q *fairQueue) len() int {
	n := 0
	for _, ws := range q.subs {
		n += len(ws)
	}
	return n
}

func (q *fairQueue) push(w *waiter) {
	if len(q.subs[w.owner]) == 0 {
		q.owners = append(q.owners, w.owner)
	}
	q.subs[w.owner] = append(q.subs[w.owner], w)
}

// pick removes and returns the first sub-queue head, in round-robin
// order from next, that fits; nil if none does.
func (q *fairQueue) pick(fits func(*waiter) bool) *waiter {
	for i := range q.owners {
		idx := (q.next + i) % len(q.owners)
		w := q.subs[q.owners[idx]][0]
		if !fits(w) {
			continue
		}
		q.remove(w)
		if len(q.owners) > 0 {
			q.next = idx % len(q.owners)
			if len(q.subs[w.owner]) > 0 {
				q.next = (idx + 1) % len(q.owners)
			}
		}
		return w
	}
	return nil
}

// remove takes w out of its sub-queue, and its owner out of the ring
// when the sub-queue empties.
func (q *fairQueue) remove(w *waiter) {
	ws := q.subs[w.owner]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) > 0 {
		q.subs[w.owner] = ws
		return
	}
	delete(q.subs, w.owner)
	for i, o := range q.owners {
		if o == w.owner {
			q.owners = append(q.owners[:i:i], q.owners[i+1:]...)
			if i < q.next {
				q.next--
			}
			break
		}
	}
	if len(q.owners) == 0 || q.next >= len(q.owners) {
		q.next = 0
	}
}

// positions returns each waiter's place (1 is next) in the order the
// round robin would serve them if every head fitted.
func (q *fairQueue) positions() map[*waiter]int {
	out := map[*waiter]int{}
	n := len(q.owners)
	pos := 1
	for round := 0; ; round++ {
		any := false
		for i := range n {
			ws := q.subs[q.owners[(q.next+i)%n]]
			if round < len(ws) {
				out[ws[round]] = pos
				pos++
				any = true
			}
		}
		if !any {
			return out
		}
	}
}

// fitsLocked says whether l fits the host's capacity now.
func (s *Service) fitsLocked(l api.Limits) bool {
	return (s.cfg.MaxComputers <= 0 || s.used+1 <= s.cfg.MaxComputers) &&
		(s.cfg.MaxMemoryBytes <= 0 || s.usedMem+l.MemoryBytes <= s.cfg.MaxMemoryBytes)
}

func (s *Service) holdLocked(l api.Limits) {
	s.used++
	s.usedMem += l.MemoryBytes
}

func (s *Service) releaseLocked(l api.Limits) {
	s.used--
	s.usedMem -= l.MemoryBytes
}

// dispatchLocked admits every waiter that fits, round robin: from the
// warm pool when a machine of its profile is ready, else by holding new
// capacity. When a waiter could fit only if idle pool machines of other
// profiles gave their capacity back, one is evicted at a time. Then it
// reports the new queue positions.
func (s *Service) dispatchLocked() {
	for {
		w := s.queue.pick(func(w *waiter) bool { return s.poolReadyLocked(w.limits) || s.fitsLocked(w.limits) })
		if w == nil {
			if s.evictForQueueLocked() {
				continue
			}
			break
		}
		if m := s.claimForLocked(w); m != nil {
			w.pooled = m
		} else {
			s.holdLocked(w.limits)
		}
		w.c.held, w.done = true, true
		close(w.admitted)
	}
	s.reportPositionsLocked()
}

func (s *Service) reportPositionsLocked() {
	for w, p := range s.queue.positions() {
		if p == w.pos {
			continue
		}
		w.pos = p
		s.ev.publish(api.Event{Computer: w.c.rec.ID, Owner: w.owner, From: api.StateQueued, To: api.StateQueued,
			At: time.Now().UTC(), Reason: "queue position", QueuePosition: p})
	}
}

// dropLocked takes a waiter that was not admitted out of the queue; one
// admitted meanwhile gives back what it was given.
func (s *Service) dropLocked(w *waiter) {
	if !w.done {
		s.queue.remove(w)
		w.done = true
	} else if w.pooled != nil {
		s.returnToPoolLocked(w.limits, w.pooled)
		w.pooled = nil
	} else if w.c.held {
		s.releaseLocked(w.limits)
	}
	w.c.held = false
	w.c.waiter = nil
}
