package opstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tetherdev/tether/admission/atomicfile"
)

// A running custodian holds its store's lock, so another process cannot
// open the database. Snapshot asks it instead: the reader drops a request
// file into the (private) store directory; the holder's poller claims it,
// and its writer goroutine, between two commits, writes every receipt it
// holds (bbolt overlaid with the results still queued for it) to a
// snapshot file that the reader reads and deletes. The request path never
// waits for this: only the write-behind commits wait, for one snapshot.

// Names of the snapshot exchange, inside the store directory.
const (
	snapPrefix     = "receipts-snapshot-"
	snapRequestExt = ".request"
	snapReadyExt   = ".json"
	snapTempExt    = ".tmp"
)

// DefaultSnapshotPoll is how often a Store looks for snapshot requests.
const DefaultSnapshotPoll = 200 * time.Millisecond

// Snapshot returns every receipt in dir, sorted by dispatch time, without
// modifying the store. A stopped custodian's store is read directly, as
// ReadOnly does (keys it left in flight read interrupted). A running
// custodian's store is read through the custodian (see above): its keys
// in flight read dispatched and its running execs pending, as they are.
// If the holder does not answer before ctx ends it fails with an error
// wrapping ErrLocked that says what to do.
func Snapshot(ctx context.Context, dir string) ([]*Receipt, error) {
	if err := CheckPrivateDir(dir); err != nil {
		return nil, err
	}
	rs, err := readOnly(dir, 50*time.Millisecond)
	if !errors.Is(err, ErrLocked) {
		return rs, err
	}
	rs, err = askHolder(ctx, dir)
	if err == nil || !errors.Is(err, ErrLocked) {
		return rs, err
	}
	if rs, rerr := readOnly(dir, 50*time.Millisecond); !errors.Is(rerr, ErrLocked) {
		return rs, rerr // the holder stopped while we waited
	}
	return nil, err
}

// askHolder requests a snapshot from the process holding dir and waits
// for it until ctx ends.
func askHolder(ctx context.Context, dir string) ([]*Receipt, error) {
	id, err := newSnapshotID()
	if err != nil {
		return nil, err
	}
	req := filepath.Join(dir, snapPrefix+id+snapRequestExt)
	f, err := os.OpenFile(req, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("request a receipts snapshot: %w", err)
	}
	f.Close()
	ready := filepath.Join(dir, snapPrefix+id+snapReadyExt)
	defer os.Remove(ready)
	defer os.Remove(req)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		data, err := readNoFollow(ready)
		if err == nil {
			return decodeSnapshot(data)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read receipts snapshot: %w", err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s is held by a running custodian that did not answer a snapshot request (%v); "+
				"if it is an older tether-custodian, stop it and run this again", ErrLocked, dir, context.Cause(ctx))
		}
	}
}

func newSnapshotID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// readNoFollow reads a regular file without following a final symlink.
func readNoFollow(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return io.ReadAll(f)
}

// decodeSnapshot decodes one stored receipt per line, strictly.
func decodeSnapshot(data []byte) ([]*Receipt, error) {
	var out []*Receipt
	for len(data) > 0 {
		line, rest, ok := bytes.Cut(data, []byte("\n"))
		if !ok {
			return nil, fmt.Errorf("%w: receipts snapshot ends without a newline", ErrCorrupt)
		}
		r, err := Unmarshal(line)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
		data = rest
	}
	sortReceipts(out)
	return out, nil
}

func sortReceipts(rs []*Receipt) {
	sort.Slice(rs, func(i, j int) bool {
		if !rs[i].DispatchedAt.Equal(rs[j].DispatchedAt) {
			return rs[i].DispatchedAt.Before(rs[j].DispatchedAt)
		}
		return rs[i].OpKey < rs[j].OpKey
	})
}

// pollSnapshots claims snapshot requests (by deleting the request file)
// and hands them to the writer, until stop is closed.
func (s *Store) pollSnapshots(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(s.opts.SnapshotPoll)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		ids := claimSnapshotRequests(s.dir)
		if len(ids) == 0 {
			continue
		}
		s.mu.Lock()
		s.snapWant = append(s.snapWant, ids...)
		s.cond.Broadcast()
		s.mu.Unlock()
	}
}

// claimSnapshotRequests returns the ids of the requests in dir, each
// claimed by removing its file (so it is served once).
func claimSnapshotRequests(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), snapPrefix)
		if !ok || !strings.HasSuffix(id, snapRequestExt) {
			continue
		}
		id = strings.TrimSuffix(id, snapRequestExt)
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// serveSnapshots answers the claimed requests. It runs on the writer
// goroutine, which alone moves receipts from the queue into bbolt, so
// bbolt overlaid with the queued receipts copied now is exactly what the
// store holds.
func (s *Store) serveSnapshots() {
	s.mu.Lock()
	ids := s.snapWant
	s.snapWant = nil
	queued := make(map[string][]byte, len(s.cache))
	for k, c := range s.cache {
		queued[k] = c.data
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	var buf bytes.Buffer
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(receiptsBucket).ForEach(func(k, v []byte) error {
			if _, ok := queued[string(k)]; !ok {
				buf.Write(v)
				buf.WriteByte('\n')
			}
			return nil
		})
	})
	for _, data := range queued {
		buf.Write(data)
		buf.WriteByte('\n')
	}
	for _, id := range ids {
		if err == nil {
			err = writeSnapshot(s.dir, id, buf.Bytes())
		}
	}
	// A failure leaves the reader without an answer; it times out and says so.
	_ = err
}

// writeSnapshot publishes data as snapshot id through atomicfile.Write, so
// the reader never sees a partial one (and, fsynced, it survives a crash
// like every other file tether replaces, though nothing needs it to).
func writeSnapshot(dir, id string, data []byte) error {
	return atomicfile.Write(filepath.Join(dir, snapPrefix+id+snapReadyExt), data, 0o600,
		atomicfile.Options{Temp: snapPrefix + id + snapTempExt})
}

// removeStaleSnapshots deletes the answers an earlier holder left (their
// readers are gone); requests stay, and this holder answers them.
func removeStaleSnapshots(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list state directory: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, snapPrefix) && (strings.HasSuffix(n, snapReadyExt) || strings.HasSuffix(n, snapTempExt)) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove stale snapshot file: %w", err)
			}
		}
	}
	return nil
}
