package service

import (
	"sync"

	"github.com/tetherdev/tether/computer/api"
)

// eventBuffer is how far a subscriber may fall behind before it is cut
// off (its channel closed), so that a missing event is never silent.
const eventBuffer = 256

type subscriber struct {
	caller api.Caller
	ch     chan api.Event
	gone   chan struct{} // closed when the subscriber is removed
}

// events fans every event out to the subscribers that may see it.
type events struct {
	mu     sync.Mutex
	closed bool
	subs   map[*subscriber]struct{}
}

func (e *events) subscribe(c api.Caller) *subscriber {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	sub := &subscriber{caller: c, ch: make(chan api.Event, eventBuffer), gone: make(chan struct{})}
	e.subs[sub] = struct{}{}
	return sub
}

// removeLocked closes sub's channel once.
func (e *events) removeLocked(sub *subscriber) {
	if _, ok := e.subs[sub]; ok {
		delete(e.subs, sub)
		close(sub.ch)
		close(sub.gone)
	}
}

func (e *events) unsubscribe(sub *subscriber) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.removeLocked(sub)
}

// publish sends ev to every subscriber whose caller may see it; one that
// is full is cut off.
func (e *events) publish(ev api.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for sub := range e.subs {
		if !sub.caller.Admin && sub.caller.Owner != ev.Owner {
			continue
		}
		select {
		case sub.ch <- ev:
		default:
			e.removeLocked(sub)
		}
	}
}

func (e *events) closeAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for sub := range e.subs {
		e.removeLocked(sub)
	}
}
