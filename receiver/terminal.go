package receiver

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/fsops"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
)

// terminal is one started command: its child, its output and, once it
// ended, its status and the digests of the files it was asked to hash.
type terminal struct {
	id      string
	tuple   string // the tuple_sha256 that started it; others cannot see it
	fence   uint64 // the fencing token of the exec_start that started it
	pending bool   // a reserved slot whose child is being started
	// owner is the id of the connection that holds the terminal (the one
	// that started it or last asked for it; 0: none, served outside a
	// wireserver.Server); orphan is the grace timer running while no live
	// connection holds it. Both are guarded by the table's mutex.
	owner  uint64
	orphan *time.Timer
	child  *spawn.Child
	out    *tailBuffer
	timer  *time.Timer
	output *os.File // read end of the output pipe
	// cgroup is the command's own cgroup (nil when containment is off);
	// watch removes it with removeCgroup before the terminal is final.
	cgroup       *termCgroup
	removeCgroup func(*termCgroup)

	mu sync.Mutex // guards exit

	done    chan struct{} // closed once exit, output and hashes are final
	exit    wire.ExitStatus
	hashes  map[string]string
	endedAt time.Time // set before done is closed
	now     func() time.Time
}

// newTerminalID returns 128 random bits in hex: terminal ids are not
// guessable across tuples (and are checked against the tuple anyway).
func newTerminalID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "t-" + hex.EncodeToString(b[:])
}

// outputGrace bounds how long output is still drained after the child is
// reaped (a member of its group that survived SIGKILL cannot exist, but a
// process that left the group may hold the pipe).
const outputGrace = 250 * time.Millisecond

// watch waits for the child, drains its output, kills and removes the
// command's cgroup, hashes the requested files, then publishes the final
// state. It owns root and closes it. The
// descriptors are closed after the state is published (nothing uses them
// any more by then), so the answer to a waiting exec_wait goes out first.
func (t *terminal) watch(root *fsops.Root, hashPaths []string, copied <-chan struct{}) {
	t.child.Reap() // woken by the child's exit itself, not by the reaper
	t.timer.Stop()
	drained(copied, t.output)
	st := t.child.Status()
	t.mu.Lock()
	if st.Signal != 0 {
		t.exit = wire.ExitStatus{Signal: signalName(st.Signal)}
	} else {
		code := st.Code
		t.exit = wire.ExitStatus{ExitCode: &code}
	}
	t.mu.Unlock()
	if t.cgroup != nil { // nothing the command started runs once the terminal is final
		t.removeCgroup(t.cgroup)
	}
	if len(hashPaths) > 0 {
		sums, err := root.Hash(hashPaths)
		if err != nil {
			sums = make(map[string]string, len(hashPaths)) // no digest ever describes an escaped path
			for _, p := range hashPaths {
				sums[p] = ""
			}
		}
		t.hashes = sums
	}
	t.endedAt = t.now()
	close(t.done)
	t.output.Close()
	root.Close()
}

// drained waits until the output copy has ended, at most outputGrace: a
// process that left the group may hold the pipe open, so after the grace
// the read end is closed and the copy is waited for, and no output is
// added once the terminal is final.
func drained(copied <-chan struct{}, output io.Closer) {
	select {
	case <-copied:
		return
	default:
	}
	grace := time.NewTimer(outputGrace)
	defer grace.Stop()
	select {
	case <-copied:
	case <-grace.C:
		output.Close()
		<-copied
	}
}

// copyOutput moves the child's output into the tail buffer until EOF or
// until the read end is closed.
func (t *terminal) copyOutput(copied chan<- struct{}) {
	_, _ = io.Copy(t.out, t.output)
	close(copied)
}

// kill signals the whole group; after the child is reaped it does nothing.
func (t *terminal) kill() { _ = t.child.Kill() }

func (t *terminal) finished() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// status returns the exit status once done, else nil.
func (t *terminal) status() *wire.ExitStatus {
	if !t.finished() {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.exit
	return &e
}

// outputSoFar is exec_output's answer. The status is read first: a
// terminal is final only once its output is drained, so an answer with an
// exit status always carries the whole output, and one without it the
// output so far, ending on a character boundary.
func (t *terminal) outputSoFar() *wire.ExecOutputResult {
	exit := t.status()
	out, trunc := t.out.Snapshot(exit != nil)
	res := &wire.ExecOutputResult{Output: out, Truncated: trunc, Exit: exit}
	if exit != nil {
		res.FileSHA256 = t.hashes
	}
	return res
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGKILL: "KILL", syscall.SIGTERM: "TERM", syscall.SIGINT: "INT", syscall.SIGHUP: "HUP",
	syscall.SIGQUIT: "QUIT", syscall.SIGSEGV: "SEGV", syscall.SIGABRT: "ABRT", syscall.SIGPIPE: "PIPE",
	syscall.SIGBUS: "BUS", syscall.SIGFPE: "FPE", syscall.SIGILL: "ILL", syscall.SIGALRM: "ALRM",
	syscall.SIGUSR1: "USR1", syscall.SIGUSR2: "USR2", syscall.SIGXCPU: "XCPU", syscall.SIGXFSZ: "XFSZ",
	syscall.SIGSYS: "SYS", syscall.SIGTRAP: "TRAP",
}

// signalName returns the signal's name without SIG ("KILL").
func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return "SIG" + itoa(int(s))
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// terminals is the table of every terminal, bounded in size in total and
// per tuple.
type terminals struct {
	mu       sync.Mutex
	max      int
	perTuple int           // bound per tuple (0: max)
	grace    time.Duration // orphan grace (0: orphans are never killed)
	log      *slog.Logger
	byID     map[string]*terminal
	opKeys   map[string]string // tuple_sha256 + "\n" + op_key of every exec_start -> terminal id
	keyLog   []keyEntry        // opKeys in insertion order, for eviction
	closed   bool
	watched  map[uint64]bool // connections whose end is watched
	stop     chan struct{}   // closed by closeAll: watchers end
	watchers sync.WaitGroup
}

// maxRememberedOpKeys bounds the exec_start keys kept for replay refusal.
const maxRememberedOpKeys = 16384

func newTerminals(max int) *terminals {
	return &terminals{max: max, byID: map[string]*terminal{}, opKeys: map[string]string{},
		watched: map[uint64]bool{}, stop: make(chan struct{}), log: slog.New(slog.DiscardHandler)}
}

// bound sets the per-tuple bound and the orphan grace; call it before
// the table is used.
func (ts *terminals) bound(perTuple int, grace time.Duration, log *slog.Logger) {
	ts.perTuple, ts.grace, ts.log = perTuple, grace, log
}

// reserve checks capacity, the tuple's max_procs and op-key replay before
// a child is started, and holds a slot: commit or cancel must follow.
func (ts *terminals) reserve(tuple, opKey string, maxProcs int, now time.Time) (slot *reservation, err error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	key := tuple + "\n" + opKey
	switch {
	case ts.closed:
		return nil, errcode.Errorf(errcode.CodeUnavailable, "receiver is shutting down")
	case ts.opKeys[key] != "":
		return nil, errcode.Errorf(errcode.CodeOpKeyConflict, "op_key %q already started terminal %s; a command never runs twice", opKey, ts.opKeys[key])
	case len(ts.byID) >= ts.max && ts.evictStale(now) == 0:
		return nil, errcode.Errorf(errcode.CodeDenied, "the receiver keeps %d terminals already; release finished ones", ts.max)
	}
	held, running := ts.countLocked(tuple)
	if ts.perTuple > 0 && held >= ts.perTuple && ts.evictStale(now) > 0 {
		held, running = ts.countLocked(tuple)
	}
	if ts.perTuple > 0 && held >= ts.perTuple {
		return nil, errcode.Errorf(errcode.CodeDenied, "this tuple keeps %d terminals, its limit; release finished ones", held)
	}
	if maxProcs > 0 && running >= maxProcs {
		return nil, errcode.Errorf(errcode.CodeDenied, "grant max_procs %d: %d commands are running", maxProcs, running)
	}
	id := newTerminalID()
	ts.byID[id] = &terminal{id: id, tuple: tuple, pending: true} // get() skips it until commit
	ts.rememberKey(key, id)
	return &reservation{ts: ts, id: id, key: key}, nil
}

// countLocked returns how many terminals tuple holds (pending, running or
// finished and unreleased) and how many of them run; reserved slots count,
// so concurrent starts cannot pass a limit together. ts.mu is held.
func (ts *terminals) countLocked(tuple string) (held, running int) {
	for _, t := range ts.byID {
		if t.tuple != tuple {
			continue
		}
		held++
		if t.pending || !t.finished() {
			running++
		}
	}
	return held, running
}

// TerminalRetention is how long a finished, unreleased terminal keeps its
// output and status once the table is full; older ones make room for new
// commands. A client that never releases cannot lock the receiver up.
const TerminalRetention = 10 * time.Minute

// evictStale drops finished terminals that ended more than
// TerminalRetention ago and returns how many; ts.mu is held.
func (ts *terminals) evictStale(now time.Time) int {
	n := 0
	for id, t := range ts.byID {
		if !t.pending && t.finished() && now.Sub(t.endedAt) > TerminalRetention {
			delete(ts.byID, id)
			n++
		}
	}
	return n
}

// running returns the terminals whose command has not ended.
func (ts *terminals) running() []*terminal {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var out []*terminal
	for _, t := range ts.byID {
		if !t.pending && !t.finished() {
			out = append(out, t)
		}
	}
	return out
}

// keyEntry is one remembered op key and the terminal it started.
type keyEntry struct{ key, id string }

func (ts *terminals) rememberKey(key, id string) {
	ts.opKeys[key] = id
	ts.keyLog = append(ts.keyLog, keyEntry{key, id})
	if len(ts.keyLog) > maxRememberedOpKeys {
		if old := ts.keyLog[0]; ts.opKeys[old.key] == old.id {
			delete(ts.opKeys, old.key)
		}
		ts.keyLog = ts.keyLog[1:]
	}
}

// reservation is a held terminal slot.
type reservation struct {
	ts  *terminals
	id  string
	key string // tuple_sha256 + "\n" + op_key
}

// commit installs t in the slot. If the table was closed meanwhile, the
// child is killed at once and false is returned.
func (r *reservation) commit(t *terminal) bool {
	r.ts.mu.Lock()
	defer r.ts.mu.Unlock()
	if r.ts.closed {
		delete(r.ts.byID, r.id)
		t.kill()
		return false
	}
	r.ts.byID[r.id] = t
	return true
}

// cancel frees the slot; the op key stays used (a retry must not run a
// command whose first start may have had effects).
func (r *reservation) cancel() {
	r.ts.mu.Lock()
	defer r.ts.mu.Unlock()
	delete(r.ts.byID, r.id)
}

// forget frees the slot and the op key: only for a start that provably ran
// nothing (the command was not found before any fork).
func (r *reservation) forget() {
	r.ts.mu.Lock()
	defer r.ts.mu.Unlock()
	delete(r.ts.byID, r.id)
	if r.ts.opKeys[r.key] == r.id {
		delete(r.ts.opKeys, r.key)
	}
}

// get returns the terminal id started by tuple, or nil.
func (ts *terminals) get(tuple, id string) *terminal {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.byID[id]
	if t == nil || t.pending || t.tuple != tuple {
		return nil
	}
	return t
}

// remove takes the terminal out of the table.
func (ts *terminals) remove(id string) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	delete(ts.byID, id)
}

// killBelow kills every running command of tuple started under a fencing
// token below tok and returns how many it signalled. The terminals stay
// (their output and status readable) until released or orphaned.
func (ts *terminals) killBelow(tuple string, tok uint64) int {
	ts.mu.Lock()
	var stale []*terminal
	for _, t := range ts.byID {
		if t.tuple == tuple && !t.pending && t.fence < tok && !t.finished() {
			stale = append(stale, t)
		}
	}
	ts.mu.Unlock()
	for _, t := range stale {
		t.kill()
	}
	return len(stale)
}

// closeAll refuses new terminals, kills every group and waits until each
// terminal is final.
func (ts *terminals) closeAll() {
	ts.mu.Lock()
	ts.closed = true
	ts.stopOrphansLocked()
	all := make([]*terminal, 0, len(ts.byID))
	for _, t := range ts.byID {
		if !t.pending { // a pending start is killed by its commit
			all = append(all, t)
		}
	}
	ts.mu.Unlock()
	ts.watchers.Wait()
	for _, t := range all {
		t.kill()
	}
	for _, t := range all {
		<-t.done
	}
}
