package opstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/custodian/internal/durable"
)

// segment is one intent log file. appended counts its intents; committed
// counts those that bbolt holds (as dispatched or with a result). A sealed
// segment whose intents are all committed is deleted.
type segment struct {
	id        uint64
	f         *os.File
	size      int64
	appended  int
	committed int
	sealed    bool
}

// intentLog is the append-only, fdatasync'd log of dispatched intents.
// Appends are group-committed: concurrent appenders share one fdatasync,
// and each returns only once its own record is durable. A failed write or
// sync breaks the log for good (the kernel may have dropped the dirty
// pages, so retrying the sync would prove nothing).
type intentLog struct {
	dir      string
	rotateAt int64

	mu        sync.Mutex
	cond      *sync.Cond
	cur       *segment
	next      *segment
	preparing bool
	segs      map[uint64]*segment
	written   uint64
	synced    uint64
	syncing   bool
	broken    error
	wg        sync.WaitGroup
}

const segPrefix, segSuffix = "intent-", ".log"

func segName(id uint64) string { return fmt.Sprintf("%s%016x%s", segPrefix, id, segSuffix) }

// listSegments returns the ids of the segment files in dir, ascending.
func listSegments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list intent segments: %w", err)
	}
	var ids []uint64
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, segPrefix) || !strings.HasSuffix(n, segSuffix) {
			continue
		}
		id, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(n, segPrefix), segSuffix), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: unexpected file %q in state directory", ErrCorrupt, n)
		}
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// openIntentLog starts a fresh segment with the given id; dir must hold no
// segment of that id. The directory is synced so the new file survives a
// crash before its first record is acknowledged.
func openIntentLog(dir string, id uint64, rotateAt int64) (*intentLog, error) {
	l := &intentLog{dir: dir, rotateAt: rotateAt, segs: map[uint64]*segment{}}
	l.cond = sync.NewCond(&l.mu)
	seg, err := createSegment(dir, id)
	if err != nil {
		return nil, err
	}
	l.cur = seg
	l.segs[id] = seg
	return l, nil
}

func createSegment(dir string, id uint64) (*segment, error) {
	f, err := os.OpenFile(filepath.Join(dir, segName(id)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create intent segment: %w", err)
	}
	if err := syncDir(dir); err != nil {
		f.Close()
		return nil, err
	}
	return &segment{id: id, f: f}, nil
}

// append writes in and returns once it is durable, with the id of the
// segment that holds it.
func (l *intentLog) append(in *Intent) (uint64, error) {
	frame, err := appendFrame(nil, in)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.broken != nil {
		return 0, l.broken
	}
	seg := l.cur
	if _, err := seg.f.Write(frame); err != nil {
		l.breakLocked(fmt.Errorf("append intent: %w", err))
		return 0, l.broken
	}
	seg.size += int64(len(frame))
	seg.appended++
	l.written++
	if err := l.waitSyncedLocked(l.written); err != nil {
		return 0, err
	}
	return seg.id, nil
}

// waitSyncedLocked returns once record seq is durable. The first waiter
// with no sync running becomes the leader and syncs everything written so
// far; the others wait for it. Called with l.mu held.
func (l *intentLog) waitSyncedLocked(seq uint64) error {
	for l.synced < seq {
		if l.broken != nil {
			return l.broken
		}
		if l.syncing {
			l.cond.Wait()
			continue
		}
		l.syncing = true
		target, f := l.written, l.cur.f
		l.mu.Unlock()
		err := fdatasync(int(f.Fd()))
		l.mu.Lock()
		l.syncing = false
		if err != nil {
			l.breakLocked(fmt.Errorf("fdatasync intent log: %w", err))
		} else {
			l.synced = target
			l.maybeRotateLocked()
		}
		l.cond.Broadcast()
	}
	return nil
}

// maybeRotateLocked seals the current segment once it is large and fully
// synced, switching to the pre-created next one; it starts preparing the
// next segment (create + directory sync, off the request path) when the
// current one is half full.
func (l *intentLog) maybeRotateLocked() {
	if l.cur.size >= l.rotateAt && l.next != nil && l.synced == l.written {
		l.cur.sealed = true
		l.releaseIfDoneLocked(l.cur)
		l.cur, l.next = l.next, nil
		l.segs[l.cur.id] = l.cur
	}
	if l.cur.size >= l.rotateAt/2 && l.next == nil && !l.preparing {
		l.preparing = true
		id := l.cur.id + 1
		l.wg.Add(1)
		go l.prepare(id)
	}
}

func (l *intentLog) prepare(id uint64) {
	defer l.wg.Done()
	seg, err := createSegment(l.dir, id)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.preparing = false
	if err != nil {
		l.breakLocked(err)
		return
	}
	l.next = seg
}

// committed records that n intents of segment id are now held by bbolt.
func (l *intentLog) committed(id uint64, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if seg, ok := l.segs[id]; ok {
		seg.committed += n
		l.releaseIfDoneLocked(seg)
	}
}

// releaseIfDoneLocked deletes a sealed segment whose every intent is in
// bbolt. A crash before the directory reaches disk only brings back intents
// that bbolt already answers.
func (l *intentLog) releaseIfDoneLocked(seg *segment) {
	if !seg.sealed || seg.committed < seg.appended {
		return
	}
	delete(l.segs, seg.id)
	seg.f.Close()
	if err := os.Remove(filepath.Join(l.dir, segName(seg.id))); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.breakLocked(fmt.Errorf("remove intent segment: %w", err))
	}
}

func (l *intentLog) breakLocked(err error) {
	if l.broken == nil {
		l.broken = fmt.Errorf("%w: %w", ErrBroken, err)
	}
	l.cond.Broadcast()
}

// close seals every segment and deletes those fully committed; the rest
// stay for the next Open's recovery.
func (l *intentLog) close() error {
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.syncing {
		l.cond.Wait()
	}
	for _, seg := range l.segs {
		seg.sealed = true
		l.releaseIfDoneLocked(seg)
	}
	for _, seg := range l.segs {
		seg.f.Close()
	}
	if l.next != nil {
		l.next.f.Close()
		os.Remove(filepath.Join(l.dir, segName(l.next.id)))
		l.next = nil
	}
	if l.broken == nil {
		l.broken = ErrClosed
	}
	return syncDir(l.dir)
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error { return durable.SyncDir(dir) }

// fdatasync is the one durable write of the hot path; tests count it.
var fdatasync = unix.Fdatasync
