package opstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tetherdev/tether/custodian/internal/durable"
)

// MinRetention is the shortest time an op key is kept: a retry within it
// is always answered from the receipt, never run again.
const MinRetention = 24 * time.Hour

// Dispatched is the state of a key whose intent is durable and whose
// result has not been recorded. It is not an outcome: after a crash it
// becomes Interrupted.
const Dispatched Outcome = "dispatched"

// Options configure a Store.
type Options struct {
	// Retention is how long a key is kept after the later of its dispatch
	// and its lease's end, so a key always outlives the lease it ran
	// under. Zero means MinRetention; less than MinRetention is refused.
	Retention time.Duration
	// SegmentBytes is the size at which the intent log rotates to a new
	// segment. Zero means 4 MiB.
	SegmentBytes int64
	// PruneEvery is how often expired receipts are deleted. Zero means 1 h.
	PruneEvery time.Duration
	// WriteDelay is how long results gather before one bbolt commit (two
	// fsyncs) records them all, off the request path. Zero means 50 ms;
	// negative means no delay. A crash inside it only turns those keys
	// interrupted.
	WriteDelay time.Duration
	// SnapshotPoll is how often the store looks for a Snapshot request from
	// another process. Zero means DefaultSnapshotPoll.
	SnapshotPoll time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

const (
	dbName       = "opkeys.db"
	lockTimeout  = time.Second
	receiptsName = "receipts"
)

var receiptsBucket = []byte(receiptsName)

func (o *Options) fill() error {
	if o.Retention == 0 {
		o.Retention = MinRetention
	}
	if o.Retention < MinRetention {
		return fmt.Errorf("%w: retention %s is shorter than the minimum %s", ErrInvalid, o.Retention, MinRetention)
	}
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = 4 << 20
	}
	if o.PruneEvery <= 0 {
		o.PruneEvery = time.Hour
	}
	if o.WriteDelay == 0 {
		o.WriteDelay = 50 * time.Millisecond
	}
	if o.SnapshotPoll <= 0 {
		o.SnapshotPoll = DefaultSnapshotPoll
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// Store is the operation-key store of one state directory. It holds the
// directory's lock from Open until Close; Close must be called. All
// methods are safe for concurrent use.
type Store struct {
	dir  string
	opts Options
	db   *bolt.DB
	log  *intentLog

	mu        sync.Mutex
	cond      *sync.Cond
	inflight  map[string]*Ticket
	cache     map[string]cached
	queue     []queued
	version   uint64
	committed uint64
	closing   bool
	closed    bool
	werr      error
	snapWant  []string // claimed snapshot requests, served by the writer
	done      chan struct{}
	pollStop  chan struct{}
	pollDone  chan struct{}
}

// cached is a receipt written to the queue and not yet committed to bbolt.
type cached struct {
	data    []byte
	version uint64
}

// queued is one bbolt put. seg, when non-zero, is the intent segment whose
// committed count the put advances.
type queued struct {
	key     string
	data    []byte
	version uint64
	seg     uint64
}

// Open opens (creating if needed) the store in dir, recovers it, and takes
// its lock. Recovery turns every key dispatched by an earlier process
// without a recorded result into an Interrupted receipt. A second Open of
// the same directory fails with ErrLocked.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	if err := ensurePrivateDir(dir); err != nil {
		return nil, err
	}
	db, err := openDB(dir)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir, opts: opts, db: db, inflight: map[string]*Ticket{},
		cache: map[string]cached{}, done: make(chan struct{}), pollStop: make(chan struct{}), pollDone: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	nextSeg, err := s.recover()
	if err == nil {
		err = removeStaleSnapshots(dir)
	}
	if err == nil {
		s.log, err = openIntentLog(dir, nextSeg, opts.SegmentBytes)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	go s.writer()
	go s.pollSnapshots(s.pollStop, s.pollDone)
	return s, nil
}

// openDB opens the bbolt file. A new file's name is made durable by
// recover's directory sync, before any intent is written.
func openDB(dir string) (*bolt.DB, error) {
	db, err := bolt.Open(filepath.Join(dir, dbName), 0o600, &bolt.Options{Timeout: lockTimeout})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("open op key database: %w", err)
	}
	return db, nil
}

// ensurePrivateDir creates dir 0700 or checks that an existing one is a
// real directory owned by this user and not writable by group or others.
func ensurePrivateDir(dir string) error {
	if err := durable.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	return CheckPrivateDir(dir)
}

// stamp validates in, refuses an ended ctx, and sets in's DispatchedAt
// and RetainUntil (the later of now and the lease, plus the retention).
func (s *Store) stamp(ctx context.Context, in *Intent) error {
	return stampIntent(ctx, in, s.opts.Now(), s.opts.Retention)
}

// Begin records that the request described by in is about to be
// dispatched, and returns once that record is durable (one fdatasync,
// shared with concurrent callers). Exactly one of the results is set:
//   - a Ticket: dispatch the request, then call Finish;
//   - a Receipt: the key was already answered for the same digest; return
//     the receipt's result and run nothing;
//   - an error: a *ConflictError (errors.Is ErrConflict) for a different
//     digest or a duplicate in flight, or a store failure.
//
// Begin sets in's DispatchedAt and RetainUntil.
func (s *Store) Begin(ctx context.Context, in Intent) (*Ticket, *Receipt, error) {
	if err := s.stamp(ctx, &in); err != nil {
		return nil, nil, err
	}
	t, replay, err := s.reserve(&in)
	if t == nil {
		return nil, replay, err
	}
	seg, err := s.log.append(&in)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		delete(s.inflight, in.key())
		return nil, nil, fmt.Errorf("record dispatch of op key %s: %w", in.OpKey, err)
	}
	t.seg = seg
	s.putLocked(in.key(), dispatchedReceipt(&in), seg)
	return t, nil, nil
}

// BeginIdempotent claims an op key like Begin, without the durable write:
// the claim and the Dispatched receipt live in memory and reach bbolt
// behind the caller, like every result. It is only for requests whose
// repetition changes nothing (SIGKILL of a process group that is already
// dead, forgetting a terminal already forgotten): a crash may lose the
// key, and a retry may then reach the receiver again, which is harmless.
// Within one process the key is answered exactly as Begin's: a replay of
// the receipt, or a *ConflictError for another digest or a duplicate in
// flight.
func (s *Store) BeginIdempotent(ctx context.Context, in Intent) (*Ticket, *Receipt, error) {
	if err := s.stamp(ctx, &in); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, replay, err := s.reserveLocked(&in)
	if t != nil {
		s.putLocked(in.key(), dispatchedReceipt(&in), 0)
	}
	return t, replay, err
}

// reserve checks the key against what is in flight and what is stored,
// and claims it for in when it is new.
func (s *Store) reserve(in *Intent) (*Ticket, *Receipt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reserveLocked(in)
}

func (s *Store) reserveLocked(in *Intent) (*Ticket, *Receipt, error) {
	if err := s.usableLocked(); err != nil {
		return nil, nil, err
	}
	if _, busy := s.inflight[in.key()]; busy {
		return nil, nil, &ConflictError{OpKey: in.OpKey, InFlight: true, Got: in.RequestSHA256}
	}
	prev, err := s.lookupLocked(in.key())
	switch {
	case errors.Is(err, ErrNotFound):
		t := &Ticket{s: s, in: *in}
		s.inflight[in.key()] = t
		return t, nil, nil
	case err != nil:
		return nil, nil, err
	}
	replay, err := answerStored(prev, in)
	return nil, replay, err
}

func (s *Store) usableLocked() error {
	switch {
	case s.closing || s.closed:
		return ErrClosed
	case s.werr != nil:
		return s.werr
	}
	return nil
}

// lookupLocked returns the receipt for key from the write queue or bbolt.
func (s *Store) lookupLocked(key string) (*Receipt, error) {
	data, err := s.rawLocked(key)
	if err != nil {
		return nil, err
	}
	return Unmarshal(data)
}

func (s *Store) rawLocked(key string) ([]byte, error) {
	if c, ok := s.cache[key]; ok {
		return c.data, nil
	}
	var data []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(receiptsBucket).Get([]byte(key)); v != nil {
			data = append([]byte(nil), v...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read receipt: %w", err)
	}
	if data == nil {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return data, nil
}

// putLocked queues r for the writer; readers see it at once.
func (s *Store) putLocked(key string, r *Receipt, seg uint64) {
	data, err := r.Marshal()
	if err != nil { // a Receipt always marshals; keep the invariant loud
		panic(fmt.Sprintf("opstore: marshal receipt: %v", err))
	}
	s.version++
	s.cache[key] = cached{data: data, version: s.version}
	s.queue = append(s.queue, queued{key: key, data: data, version: s.version, seg: seg})
	s.cond.Broadcast()
}

func dispatchedReceipt(in *Intent) *Receipt {
	return &Receipt{OpKey: in.OpKey, RequestSHA256: in.RequestSHA256, Method: in.Method,
		SessionID: in.SessionID, TupleSHA256: in.TupleSHA256, Principal: in.Principal,
		LeaseNotAfter: in.LeaseNotAfter, DispatchedAt: in.DispatchedAt,
		RetainUntil: in.RetainUntil, Outcome: Dispatched, TaggedBy: in.TaggedBy}
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func nowUTC() time.Time { return time.Now().UTC() }
