package receiver

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/fsops"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// Bounds of chunked writes (docs/protocol.md "Chunked files").
const (
	// MaxTransfersPerTuple is how many writes one tuple may have open at
	// once; one more write_begin is denied.
	MaxTransfersPerTuple = 8
	// MaxTransfers bounds the open writes of every tuple together.
	MaxTransfers = 256
	// TransferIdle is how long an open write waits for its next chunk or
	// its commit before it is dropped.
	TransferIdle = 60 * time.Second
)

// transfer is one open chunked write: its staged content, the tuple that
// opened it and the connection that holds it (0 outside a wireserver.Server).
type transfer struct {
	id    string
	tuple string
	conn  uint64
	mu    sync.Mutex // serialises chunks, commit and drop
	st    *fsops.Staged
	idle  *time.Timer
}

// transfers is the table of open writes. A write ends with its commit, an
// abort, a failed chunk, its idle timeout, the end of its connection or
// the handler's Close; in every case but a commit its staged content,
// which never had a name, is dropped.
type transfers struct {
	mu      sync.Mutex
	byID    map[string]*transfer
	watched map[uint64]bool
	closed  bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newTransfers() *transfers {
	return &transfers{byID: map[string]*transfer{}, watched: map[uint64]bool{}, stop: make(chan struct{})}
}

// open registers st for tuple on conn, within the bounds.
func (ts *transfers) open(tuple string, conn *wireserver.Conn, st *fsops.Staged) (*transfer, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	switch n := ts.countLocked(tuple); {
	case ts.closed:
		return nil, errcode.Errorf(errcode.CodeUnavailable, "receiver is shutting down")
	case n >= MaxTransfersPerTuple:
		return nil, errcode.Errorf(errcode.CodeDenied, "this tuple has %d chunked writes open, its limit; commit or abort one", n)
	case len(ts.byID) >= MaxTransfers:
		return nil, errcode.Errorf(errcode.CodeDenied, "the receiver has %d chunked writes open, its limit", len(ts.byID))
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	t := &transfer{id: "w-" + hex.EncodeToString(b[:]), tuple: tuple, st: st}
	t.idle = time.AfterFunc(TransferIdle, func() { ts.drop(t) })
	if conn != nil {
		t.conn = conn.ID
		ts.watchLocked(conn)
	}
	ts.byID[t.id] = t
	return t, nil
}

func (ts *transfers) countLocked(tuple string) int {
	n := 0
	for _, t := range ts.byID {
		if t.tuple == tuple {
			n++
		}
	}
	return n
}

// watchLocked drops conn's transfers once it ends; ts.mu is held.
func (ts *transfers) watchLocked(conn *wireserver.Conn) {
	if ts.watched[conn.ID] {
		return
	}
	ts.watched[conn.ID] = true
	ts.wg.Go(func() {
		select {
		case <-conn.Done():
		case <-ts.stop:
			return
		}
		ts.mu.Lock()
		delete(ts.watched, conn.ID)
		var gone []*transfer
		for _, t := range ts.byID {
			if t.conn == conn.ID {
				gone = append(gone, t)
			}
		}
		ts.mu.Unlock()
		for _, t := range gone {
			ts.drop(t)
		}
	})
}

// get returns tuple's transfer id, locked, with its idle timer stopped;
// the caller calls done (or takes it out with take).
func (ts *transfers) get(tuple, id string) (*transfer, error) {
	ts.mu.Lock()
	t := ts.byID[id]
	ts.mu.Unlock()
	if t == nil || t.tuple != tuple {
		return nil, errcode.Errorf(errcode.CodeNotFound, "no open chunked write %q for this tuple (committed, aborted, idle past %s, or its connection ended)", id, TransferIdle)
	}
	t.mu.Lock()
	if t.st == nil { // dropped while we waited
		t.mu.Unlock()
		return nil, errcode.Errorf(errcode.CodeNotFound, "chunked write %q was dropped", id)
	}
	t.idle.Stop()
	return t, nil
}

// done unlocks t and restarts its idle timer.
func (ts *transfers) done(t *transfer) {
	t.idle.Reset(TransferIdle)
	t.mu.Unlock()
}

// take removes t (locked by get) from the table and unlocks it; its
// staged content is the caller's to commit and close.
func (ts *transfers) take(t *transfer) *fsops.Staged {
	ts.mu.Lock()
	delete(ts.byID, t.id)
	ts.mu.Unlock()
	st := t.st
	t.st = nil
	t.mu.Unlock()
	return st
}

// drop removes t and discards its staged content.
func (ts *transfers) drop(t *transfer) {
	t.mu.Lock()
	ts.mu.Lock()
	delete(ts.byID, t.id)
	ts.mu.Unlock()
	st := t.st
	t.st = nil
	t.idle.Stop()
	t.mu.Unlock()
	if st != nil {
		st.Close()
	}
}

// dropLocked is drop for a transfer get returned (t.mu held).
func (ts *transfers) dropLocked(t *transfer) {
	st := ts.take(t)
	st.Close()
}

// closeAll drops every open write and refuses new ones.
func (ts *transfers) closeAll() {
	ts.mu.Lock()
	ts.closed = true
	close(ts.stop)
	all := make([]*transfer, 0, len(ts.byID))
	for _, t := range ts.byID {
		all = append(all, t)
	}
	ts.mu.Unlock()
	ts.wg.Wait()
	for _, t := range all {
		ts.drop(t)
	}
}

// count returns how many writes are open.
func (ts *transfers) count() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.byID)
}
