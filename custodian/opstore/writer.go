package opstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// writer commits queued receipts to bbolt in order, one transaction per
// batch, and prunes expired keys. It runs until Close.
func (s *Store) writer() {
	defer close(s.done)
	prune := time.NewTicker(s.opts.PruneEvery)
	defer prune.Stop()
	kick := make(chan struct{}, 1)
	stopKick := make(chan struct{})
	defer close(stopKick)
	go func() { // turn ticks into cond wake-ups
		for {
			select {
			case <-prune.C:
				select {
				case kick <- struct{}{}:
				default:
				}
				s.mu.Lock()
				s.cond.Broadcast()
				s.mu.Unlock()
			case <-stopKick:
				return
			}
		}
	}()
	for {
		batch, stop := s.nextBatch(kick)
		if len(batch) > 0 {
			s.commit(batch)
		}
		s.serveSnapshots()
		select {
		case <-kick:
			s.prune()
		default:
		}
		if stop {
			return
		}
	}
}

// nextBatch waits for queued puts, a prune tick or Close.
func (s *Store) nextBatch(kick chan struct{}) ([]queued, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.queue) == 0 && !s.closing && len(kick) == 0 && len(s.snapWant) == 0 {
		s.cond.Wait()
	}
	if len(s.queue) > 0 && !s.closing && s.opts.WriteDelay > 0 {
		s.mu.Unlock()
		time.Sleep(s.opts.WriteDelay)
		s.mu.Lock()
	}
	batch := s.queue
	s.queue = nil
	return batch, s.closing && len(batch) == 0
}

// commit writes one batch. After a failed commit the store is broken:
// results stay answerable in this process, and the intents already on
// disk make those keys Interrupted after a restart. Sealed segments the
// batch completes are released before Flush can observe the commit.
func (s *Store) commit(batch []queued) {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(receiptsBucket)
		for _, q := range batch {
			if err := b.Put([]byte(q.key), q.data); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		segs := map[uint64]int{}
		for _, q := range batch {
			if q.seg != 0 {
				segs[q.seg]++
			}
		}
		for id, n := range segs {
			s.log.committed(id, n)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.cond.Broadcast()
	if err != nil {
		if s.werr == nil {
			s.werr = fmt.Errorf("%w: commit receipts: %w", ErrBroken, err)
		}
		return
	}
	for _, q := range batch {
		if c, ok := s.cache[q.key]; ok && c.version == q.version {
			delete(s.cache, q.key)
		}
	}
	s.committed = batch[len(batch)-1].version
}

// Prune deletes now the final receipts whose retention has passed, as the
// store also does every PruneEvery. A key is kept until the later of its
// own RetainUntil and its tuple's latest recorded lease end (KeepForLease)
// plus the retention. A failure breaks the store, like a failed commit.
func (s *Store) Prune(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	err := s.usableLocked()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.prune()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usableLocked()
}

// prune deletes final receipts whose retention has passed.
func (s *Store) prune() {
	now := s.opts.Now()
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, leases := tx.Bucket(receiptsBucket), tx.Bucket(leasesBucket)
		var expired [][]byte
		err := b.ForEach(func(k, v []byte) error {
			r, err := Unmarshal(v)
			if err == nil && r.Outcome.Final() && now.After(s.retainUntil(leases, r)) {
				expired = append(expired, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range expired {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return s.pruneLeases(leases, now)
	})
	if err != nil {
		s.mu.Lock()
		if s.werr == nil {
			s.werr = fmt.Errorf("%w: prune receipts: %w", ErrBroken, err)
		}
		s.mu.Unlock()
	}
}

// Flush waits until every receipt queued before the call is committed to
// bbolt, or ctx ends.
func (s *Store) Flush(ctx context.Context) error {
	s.mu.Lock()
	target := s.version
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.committed < target {
		if s.werr != nil {
			return s.werr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		s.cond.Wait()
	}
	return nil
}

// Close stops accepting requests, commits everything queued, deletes the
// intent segments bbolt fully answers and releases the lock. Keys still in
// flight stay Dispatched and become Interrupted at the next Open. Close is
// safe to call twice.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		<-s.done
		return nil
	}
	s.closing = true
	s.cond.Broadcast()
	s.mu.Unlock()
	close(s.pollStop)
	<-s.pollDone
	<-s.done
	s.mu.Lock()
	s.closed = true
	werr := s.werr
	s.mu.Unlock()
	return errors.Join(werr, s.log.close(), s.db.Close())
}
