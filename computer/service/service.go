// Package service is the computer service's core: Service implements
// api.Backend over an api.Provisioner, keeps each computer's record in
// bbolt (written before the side effect it describes), appends every
// transition to the lifecycle log, and runs the lease, idle, capacity
// queue and warm pool.
//
// A suspended computer's lease keeps running: the lease bounds how long
// a grant may admit anything, and a frozen computer still holds its
// grant, its uid and its memory; letting a freeze stop the clock would let
// a forgotten computer live forever by idling. So a suspended computer
// still expires, in the same order as a running one.
package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/lifecycle"
)

var _ api.Backend = (*Service)(nil)

// Files of Config.Dir: the bbolt store of records, and the transition
// log (check it with lifecycle.Verify).
const (
	StateFile = "state.db"
	LogFile   = "transitions.log"
	// RecordsDir holds, per computer id, the custody records (receipts,
	// audit log, its public key) its teardown kept; nothing removes them.
	RecordsDir = "records"
)

// refer tells c's machine which service made it (api.Referrer), when the
// service has a socket to name; the machine's next Grant writes it for
// the custodian. The caller holds c.op.
func (s *Service) refer(c *computer) {
	if r, ok := c.m.(api.Referrer); ok && s.cfg.Socket != "" {
		r.SetServiceRef(api.ServiceRef{Socket: s.cfg.Socket, ID: c.rec.ID})
	}
}

// recordsDir is where the teardown of computer id keeps its records.
func (s *Service) recordsDir(id string) string { return filepath.Join(s.cfg.Dir, RecordsDir, id) }

// computer is the service's live view of one computer.
type computer struct {
	// op serializes this computer's transitions and the side effects
	// they describe; it is taken before s.mu, never while holding it.
	op sync.Mutex
	m  api.Machine // nil until made; guarded by op
	// attached says the egress proxy serves it, refusalLog where its
	// refusals show (egress.go); written holding op and Service.mu, read
	// holding either.
	attached   bool
	refusalLog string

	// Guarded by Service.mu.
	rec        record
	deadline   time.Time // lease end, with its monotonic reading
	timer      *time.Timer
	lastActive time.Time // monotonic
	held       bool      // holds a capacity slot and its memory
	counted    bool      // counts toward its owner's quota
	waiter     *waiter   // while queued
}

// Service implements api.Backend. Open makes one; Close ends its
// background work and closes its files, leaving the computers running
// for the next Open to adopt.
type Service struct {
	cfg  Config
	prov api.Provisioner
	st   *store
	log  *lifecycle.Log

	ctx    context.Context // ends at Close: background work and side effects
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	computers map[string]*computer
	used      int
	usedMem   int64
	perOwner  map[string]int
	queue     fairQueue
	pools     []*pool
	// evicting and evictingMem are the capacity of pool machines being
	// closed to make room: still held until each is gone.
	evicting    int
	evictingMem int64

	refill chan struct{}
	ev     events
}

// Open opens (or creates) the state in cfg.Dir, re-adopts the computers
// a previous daemon left, finishes what it left mid-way, and starts the
// lease timers, the idle watcher and the pool refill. The caller Closes
// the Service.
func Open(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	if err := makeDirs(cfg.Dir); err != nil {
		return nil, err
	}
	st, err := openStore(filepath.Join(cfg.Dir, StateFile))
	if err != nil {
		return nil, err
	}
	lg, err := lifecycle.Open(filepath.Join(cfg.Dir, LogFile))
	if err != nil {
		st.close()
		return nil, fmt.Errorf("service: %w", err)
	}
	s := newService(cfg, st, lg)
	if err := s.recover(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("service: restart: %w", err)
	}
	s.start()
	return s, nil
}

// makeDirs makes the state directory and the machines' parents: mode
// 0711, so a computer's users can reach their own directory beneath
// (the provisioner requires it) but no one but root lists them. The
// store and the log are 0600.
func makeDirs(dir string) error {
	for _, d := range []string{dir, filepath.Join(dir, "computers"), filepath.Join(dir, "pool")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("service: state dir: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return fmt.Errorf("service: state dir: %w", err)
		}
	}
	return nil
}

func newService(cfg Config, st *store, lg *lifecycle.Log) *Service {
	s := &Service{cfg: cfg, prov: cfg.Provisioner, st: st, log: lg, computers: map[string]*computer{},
		perOwner: map[string]int{}, refill: make(chan struct{}, 1)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.queue.subs = map[string][]*waiter{}
	s.ev.subs = map[*subscriber]struct{}{}
	for _, p := range cfg.Pools {
		s.pools = append(s.pools, &pool{Profile: p})
	}
	return s
}

// start runs the background loops; each ends when s.ctx does.
func (s *Service) start() {
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.idleLoop() }()
	go func() { defer s.wg.Done(); s.refillLoop() }()
	s.kickRefill()
}

// Close stops the timers and background work, waits for it, and closes
// the store and the log. Computers keep running; pool machines are left
// for the next Open to destroy. Safe to call twice.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, c := range s.computers {
		if c.timer != nil {
			c.timer.Stop()
		}
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.ev.closeAll()
	return errors.Join(s.log.Close(), s.st.close())
}

// goBackground runs f on the service's wait group unless it is closing.
func (s *Service) goBackground(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.wg.Add(1)
	go func() { defer s.wg.Done(); f() }()
}

// move makes one transition of c: it checks it, writes the record (with
// edit applied) to the store, appends it to the log, and publishes the
// event. The caller holds c.op, and performs the side effect the new
// state describes only after move returns nil.
func (s *Service) move(c *computer, to, reason string, edit func(*record)) error {
	s.mu.Lock()
	rec := c.rec
	s.mu.Unlock()
	from := rec.State
	if err := lifecycle.Check(from, to); err != nil {
		return err
	}
	rec.State, rec.Reason = to, reason
	if edit != nil {
		edit(&rec)
	}
	if err := s.st.put(rec); err != nil {
		return err
	}
	lr, err := s.log.Append(lifecycle.Record{Computer: rec.ID, Owner: rec.Owner, From: from, To: to,
		At: time.Now(), Reason: reason})
	if err != nil {
		return err
	}
	s.mu.Lock()
	c.rec = rec
	s.mu.Unlock()
	s.ev.publish(api.Event{Seq: lr.Seq, Computer: rec.ID, Owner: rec.Owner, From: from, To: to, At: lr.At,
		Reason: reason})
	return nil
}

// edit writes a change of c's record that is no transition (a renewed
// lease). The caller holds c.op.
func (s *Service) edit(c *computer, f func(*record)) error {
	s.mu.Lock()
	rec := c.rec
	s.mu.Unlock()
	f(&rec)
	if err := s.st.put(rec); err != nil {
		return err
	}
	s.mu.Lock()
	c.rec = rec
	s.mu.Unlock()
	return nil
}

// lookup finds id for caller: a computer of another owner is not found
// (and reported to OnDenied), unless the caller is an admin.
func (s *Service) lookup(caller api.Caller, id string) (*computer, error) {
	s.mu.Lock()
	c, ok := s.computers[id]
	owner := ""
	if ok {
		owner = c.rec.Owner
	}
	s.mu.Unlock()
	if ok && (caller.Admin || owner == caller.Owner) {
		return c, nil
	}
	if ok && s.cfg.OnDenied != nil {
		s.cfg.OnDenied(caller, id)
	}
	return nil, api.Errorf(api.CodeNotFound, "no computer %q", id)
}

// view is what the API says about c; the caller holds s.mu.
func (c *computer) view() api.Computer {
	r := c.rec
	return api.Computer{ID: r.ID, Owner: r.Owner, State: r.State, Tier: tierName(r.Tier), Accelerator: r.Accelerator, Transport: r.Transport, Limits: r.Limits,
		Tuple: r.Tuple, Labels: r.Labels, CreatedAt: r.Created, LeaseExpiresAt: r.LeaseEnd,
		IdleTimeoutSeconds: r.IdleTimeoutSecs, CustodianConfig: r.CustodianConfig, FromPool: r.FromPool,
		Reason: r.Reason, Screen: r.Screen}
}

// viewWithRecords is view, naming where an ended computer's records are.
func (s *Service) viewWithRecords(c *computer) api.Computer {
	v := c.view()
	if v.State == api.StateDeleted || v.State == api.StateFailed {
		if _, err := os.Stat(s.recordsDir(v.ID)); err == nil {
			v.Records = s.recordsDir(v.ID)
		}
	}
	return v
}

func (s *Service) viewOf(c *computer) api.Computer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.viewWithRecords(c)
}

func (s *Service) stateOf(c *computer) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return c.rec.State
}

// Get returns one computer the caller may see.
func (s *Service) Get(ctx context.Context, caller api.Caller, id string) (api.Computer, error) {
	c, err := s.lookup(caller, id)
	if err != nil {
		return api.Computer{}, err
	}
	return s.viewOf(c), nil
}

// List returns the computers the caller may see (deleted and failed
// ones included), oldest first.
func (s *Service) List(ctx context.Context, caller api.Caller) ([]api.Computer, error) {
	s.mu.Lock()
	out := []api.Computer{}
	for _, c := range s.computers {
		if caller.Admin || c.rec.Owner == caller.Owner {
			out = append(out, s.viewWithRecords(c))
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Events streams the events the caller may see until ctx ends.
func (s *Service) Events(ctx context.Context, caller api.Caller) (<-chan api.Event, error) {
	sub := s.ev.subscribe(caller)
	if sub == nil {
		return nil, api.Errorf(api.CodeUnavailable, "the service is shutting down")
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-sub.gone:
		}
		s.ev.unsubscribe(sub)
	}()
	return sub.ch, nil
}

func newID(prefix string) string {
	b := make([]byte, 12)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// internal wraps an unexpected failure as an internal error that names
// the step.
func internal(step string, err error) error {
	return &wrapped{api.Errorf(api.CodeInternal, "%s: %v", step, err), err}
}

// wrapped is an *api.Error that keeps its cause for errors.Is.
type wrapped struct {
	coded *api.Error
	cause error
}

func (w *wrapped) Error() string   { return w.coded.Error() }
func (w *wrapped) Unwrap() []error { return []error{w.coded, w.cause} }
