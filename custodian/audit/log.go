package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/internal/durable"
)

// File names inside an audit directory.
const (
	LogFile        = "log"
	CheckpointFile = "checkpoint"
)

// Errors of the log; callers branch on them with errors.Is.
var (
	// ErrBroken: a write or fdatasync failed; the log accepts nothing more.
	ErrBroken = errors.New("audit log broken")
	// ErrClosed: the log was closed.
	ErrClosed = errors.New("audit log closed")
	// ErrTampered: the records do not match the signed checkpoint (edited,
	// reordered or removed).
	ErrTampered = errors.New("audit log does not match its checkpoint")
	// ErrTruncated: the log holds fewer records than a checkpoint covers.
	ErrTruncated = errors.New("audit log truncated")
	// ErrInconsistent: an older checkpoint is not a prefix of this log.
	ErrInconsistent = errors.New("audit log inconsistent with an older checkpoint")
)

// Options configure a Log.
type Options struct {
	// Signer signs checkpoints; Verifier checks the log's own checkpoint
	// at Open. LoadSigner returns both from a key file's contents.
	Signer   note.Signer
	Verifier note.Verifier
	// CheckpointEvery is the period of checkpoints while records arrive.
	// Zero means 30 s.
	CheckpointEvery time.Duration
	// MaxQueue bounds records waiting for the writer; Append blocks (never
	// drops) beyond it. Zero means 65536.
	MaxQueue int
	// GroupDelay is how long the writer lets records gather after the
	// first one arrives, so a burst shares one write and one fdatasync
	// (and the log's fsyncs stay off the disk queue of the requests it
	// audits). Zero means 50 ms; negative means no delay.
	GroupDelay time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// OnCheckpoint, if set, is called with the size of each checkpoint
	// the log signs and writes (periodic, Checkpoint, Close; not the
	// size-0 checkpoint of a new log), after the file is in place. It
	// runs on the writer's or the caller's goroutine with checkpoint
	// writes held, so it must return at once: Submitter.Notify only
	// signals the submitter's goroutine.
	OnCheckpoint func(size int64)
}

// Log is an open audit log. It holds the directory from Open until Close,
// which must be called (it writes the final checkpoint). Methods are safe
// for concurrent use.
type Log struct {
	dir  string
	opts Options
	f    *os.File

	mu       sync.Mutex
	cond     *sync.Cond
	queue    [][]byte
	next     int64 // seq of the next Append
	durable  int64 // records written and synced
	tree     tree
	closing  bool
	broken   error
	lastCkpt int64
	tickDue  bool

	ckMu sync.Mutex // serialises checkpoint file writes
	done chan struct{}
	stop chan struct{}
}

// Open opens (creating if needed) the audit log in dir. An existing log is
// checked against its checkpoint and refused with ErrTampered or
// ErrTruncated if it does not match: the custodian never appends to a log
// it cannot vouch for. A torn last line (an append interrupted by a crash,
// never synced) is cut off.
func Open(dir string, opts Options) (*Log, error) {
	if opts.Signer == nil || opts.Verifier == nil {
		return nil, errors.New("audit: a signer and its verifier are required")
	}
	if opts.Signer.Name() != opts.Verifier.Name() || opts.Signer.KeyHash() != opts.Verifier.KeyHash() {
		return nil, errors.New("audit: signer and verifier are not the same key")
	}
	opts.fill()
	if err := durable.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: create directory: %w", err)
	}
	if err := credfile.CheckPrivateDir(dir); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l := &Log{dir: dir, opts: opts, done: make(chan struct{}), stop: make(chan struct{})}
	l.cond = sync.NewCond(&l.mu)
	if err := l.load(); err != nil {
		return nil, err
	}
	go l.writer()
	return l, nil
}

func (o *Options) fill() {
	if o.CheckpointEvery <= 0 {
		o.CheckpointEvery = 30 * time.Second
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = 65536
	}
	if o.GroupDelay == 0 {
		o.GroupDelay = 50 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// load reads the existing records, rebuilds the tree, checks the existing
// checkpoint and opens the file for appending. A new log gets a signed
// checkpoint of size 0 before any record is written, so a log with
// records and no checkpoint is never taken for a fresh one.
func (l *Log) load() error {
	path := filepath.Join(l.dir, LogFile)
	created, err := durable.CreatedFile(path)
	if err != nil {
		return fmt.Errorf("audit: open log: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: open log: %w", err)
	}
	if created {
		if err := durable.SyncDir(l.dir); err != nil {
			f.Close()
			return fmt.Errorf("audit: create log: %w", err)
		}
	}
	t, complete, size, err := readTree(f)
	if err == nil {
		err = l.checkOwnCheckpoint(t, size)
	}
	if err == nil && complete < size {
		err = f.Truncate(complete) // torn tail: never acknowledged
	}
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.tree, l.next, l.durable = f, *t, t.n, t.n
	return nil
}

// readTree decodes every record of f and builds its tree.
func readTree(f *os.File) (*tree, int64, int64, error) {
	data, err := readAll(f)
	if err != nil {
		return nil, 0, 0, err
	}
	lines, complete, err := SplitLog(data)
	if err != nil {
		return nil, 0, 0, err
	}
	t := &tree{}
	for i, line := range lines {
		r, err := DecodeRecord(line)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("record %d: %w", i, err)
		}
		if r.Seq != int64(i) {
			return nil, 0, 0, fmt.Errorf("%w: record %d has seq %d (reordered or removed)", ErrTampered, i, r.Seq)
		}
		if err := t.add(line); err != nil {
			return nil, 0, 0, err
		}
	}
	return t, int64(complete), int64(len(data)), nil
}

func readAll(f *os.File) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit: stat log: %w", err)
	}
	data := make([]byte, fi.Size())
	if _, err := f.ReadAt(data, 0); err != nil && fi.Size() > 0 {
		return nil, fmt.Errorf("audit: read log: %w", err)
	}
	return data, nil
}

// checkOwnCheckpoint refuses to continue a log that its last checkpoint
// does not describe. A missing checkpoint is accepted only for an empty
// log (size is the log's length in bytes, torn tail included): one that
// was created and then crashed before its size-0 checkpoint was written.
// It then gets that checkpoint. A log with any byte and no checkpoint is
// refused: deleting the checkpoint must not let an edited log be
// accepted and signed again.
func (l *Log) checkOwnCheckpoint(t *tree, size int64) error {
	msg, err := os.ReadFile(filepath.Join(l.dir, CheckpointFile))
	if errors.Is(err, os.ErrNotExist) {
		if size > 0 {
			return fmt.Errorf("%w: the log holds %d bytes (%d records) but its checkpoint is missing", ErrTampered, size, t.n)
		}
		return l.initialCheckpoint(t)
	}
	if err != nil {
		return fmt.Errorf("audit: read checkpoint: %w", err)
	}
	c, err := OpenCheckpoint(msg, l.opts.Verifier)
	if err != nil {
		return err
	}
	if c.Size > t.n {
		return fmt.Errorf("%w: checkpoint covers %d records, log has %d", ErrTruncated, c.Size, t.n)
	}
	root, err := t.root(c.Size)
	if err != nil {
		return err
	}
	if root != c.Hash {
		return fmt.Errorf("%w: the first %d records do not hash to the checkpoint", ErrTampered, c.Size)
	}
	l.lastCkpt = c.Size
	return nil
}

// initialCheckpoint signs and writes the size-0 checkpoint of an empty
// log; writeFileAtomic's directory sync also makes the new log file's
// name durable.
func (l *Log) initialCheckpoint(t *tree) error {
	root, err := t.root(0)
	if err != nil {
		return err
	}
	msg, err := SignCheckpoint(Checkpoint{Origin: l.opts.Signer.Name(), Size: 0, Hash: root}, l.opts.Signer)
	if err == nil {
		err = writeFileAtomic(l.dir, CheckpointFile, msg)
	}
	if err != nil {
		return fmt.Errorf("audit: write the initial checkpoint: %w", err)
	}
	return nil
}

// Append queues r (with Seq set to its position) and returns at once; the
// writer makes it durable behind the caller, in Append order. It blocks
// only when MaxQueue records are waiting. It fails when the log is closed
// or broken: the caller must then refuse to act unaudited.
func (l *Log) Append(r Record) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.queue) >= l.opts.MaxQueue && l.broken == nil && !l.closing {
		l.cond.Wait()
	}
	if err := l.usableLocked(); err != nil {
		return 0, err
	}
	r.Seq = l.next
	if r.Time.IsZero() {
		r.Time = l.opts.Now().UTC()
	}
	data, err := r.encode()
	if err != nil {
		return 0, err
	}
	l.next++
	l.queue = append(l.queue, data)
	l.cond.Broadcast()
	return r.Seq, nil
}

func (l *Log) usableLocked() error {
	switch {
	case l.broken != nil:
		return l.broken
	case l.closing:
		return ErrClosed
	}
	return nil
}

// Err returns why the log stopped accepting records, or nil.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usableLocked()
}

// writer makes queued records durable, one write and one fdatasync per
// batch, then adds them to the tree.
func (l *Log) writer() {
	defer close(l.done)
	tick := time.NewTicker(l.opts.CheckpointEvery)
	defer tick.Stop()
	go l.wakeOn(tick.C)
	for {
		batch, stop := l.take()
		if len(batch) > 0 {
			l.writeBatch(batch)
		}
		if stop {
			return
		}
		if l.dueCheckpoint() {
			_, _ = l.checkpointDurable() // a failure breaks the log; Err reports it
		}
	}
}

// wakeOn wakes the writer on every tick so periodic checkpoints happen
// even when no record arrives.
func (l *Log) wakeOn(c <-chan time.Time) {
	for {
		select {
		case <-c:
			l.mu.Lock()
			l.tickDue = true
			l.cond.Broadcast()
			l.mu.Unlock()
		case <-l.stop:
			return
		}
	}
}

// take waits for queued records (or a tick, or Close), lets a group
// gather for GroupDelay, and takes them all.
func (l *Log) take() ([][]byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) == 0 && !l.closing && l.broken == nil {
		l.cond.Wait()
	}
	if len(l.queue) > 0 && !l.closing && l.opts.GroupDelay > 0 && len(l.queue) < l.opts.MaxQueue/2 {
		l.mu.Unlock()
		time.Sleep(l.opts.GroupDelay)
		l.mu.Lock()
	}
	batch := l.queue
	l.queue = nil
	l.cond.Broadcast() // room for blocked Appends
	return batch, (l.closing || l.broken != nil) && len(batch) == 0
}

func (l *Log) writeBatch(batch [][]byte) {
	var buf []byte
	for _, d := range batch {
		buf = append(append(buf, d...), '\n')
	}
	_, err := l.f.Write(buf)
	if err == nil {
		err = fdatasync(int(l.f.Fd()))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.cond.Broadcast()
	if err != nil {
		l.breakLocked(fmt.Errorf("write records: %w", err))
		return
	}
	for _, d := range batch {
		if err := l.tree.add(d); err != nil {
			l.breakLocked(err)
			return
		}
	}
	l.durable = l.tree.n
}

func (l *Log) breakLocked(err error) {
	if l.broken == nil {
		l.broken = fmt.Errorf("%w: %w", ErrBroken, err)
	}
}

// fdatasync is the durable write of a batch; tests count it.
var fdatasync = unix.Fdatasync
