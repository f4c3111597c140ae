package receiver

import (
	"time"

	"github.com/tetherdev/tether/receiver/wireserver"
)

// A terminal is held by one connection: the one that started it, or the
// last one that asked for it. When that connection ends (a custodian that
// crashed, a link that broke) the terminal is orphaned: unless a live
// connection asks for it (any terminal op naming it, with its tuple: a
// reattach) within the orphan grace, its command is killed and the
// terminal forgotten, as exec_release would. Requests served outside a
// wireserver.Server (no wireserver.Conn) never orphan anything.

// claim makes conn the holder of t and stops its grace timer. A request
// from a connection that has already ended claims nothing; a terminal
// no live connection holds then starts its grace.
func (ts *terminals) claim(t *terminal, conn *wireserver.Conn) {
	if conn == nil {
		return
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed || ts.byID[t.id] != t {
		return
	}
	select {
	case <-conn.Done():
		if t.owner == 0 && t.orphan == nil {
			ts.orphanLocked(t)
		}
		return
	default:
	}
	t.owner = conn.ID
	if t.orphan != nil {
		t.orphan.Stop()
		t.orphan = nil
	}
	if !ts.watched[conn.ID] {
		ts.watched[conn.ID] = true
		ts.watchers.Go(func() { ts.watch(conn) })
	}
}

// watch orphans the terminals conn holds once it ends.
func (ts *terminals) watch(conn *wireserver.Conn) {
	select {
	case <-conn.Done():
	case <-ts.stop:
		return
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	delete(ts.watched, conn.ID)
	if ts.closed {
		return
	}
	for _, t := range ts.byID {
		if t.owner == conn.ID && !t.pending {
			t.owner = 0
			ts.orphanLocked(t)
		}
	}
}

// orphanLocked starts t's grace; ts.mu is held.
func (ts *terminals) orphanLocked(t *terminal) {
	if ts.grace <= 0 {
		return
	}
	var timer *time.Timer
	timer = time.AfterFunc(ts.grace, func() { ts.expire(t, timer) }) // timer is read under ts.mu
	t.orphan = timer
}

// expire kills and forgets t if its grace timer is still timer: no
// connection asked for it meanwhile.
func (ts *terminals) expire(t *terminal, timer *time.Timer) {
	ts.mu.Lock()
	if ts.closed || ts.byID[t.id] != t || t.orphan != timer {
		ts.mu.Unlock()
		return
	}
	delete(ts.byID, t.id)
	t.orphan = nil
	ts.mu.Unlock()
	ts.log.Warn("receiver: orphaned command killed and forgotten: its connection ended and none asked for it within the grace",
		"terminal", t.id, "grace", ts.grace.String())
	t.kill()
}

// stopOrphansLocked ends the watchers and grace timers (closeAll); ts.mu
// is held.
func (ts *terminals) stopOrphansLocked() {
	select {
	case <-ts.stop:
		return
	default:
	}
	close(ts.stop)
	for _, t := range ts.byID {
		if t.orphan != nil {
			t.orphan.Stop()
			t.orphan = nil
		}
	}
}
