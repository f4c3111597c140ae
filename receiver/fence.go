package receiver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/receiver/wire"
)

// Fencing (docs/protocol.md "Fencing"). A custodian that owns a session
// in a fleet sends its fencing token (the create revision of its etcd
// owner key) in every request. The receiver keeps, per tuple, the highest
// token a request has carried, in a state file made durable before the
// request that raised it runs. A request whose token is below it is
// refused as fenced and runs nothing; a request without a token is
// refused the same way once the tuple has seen one.

// MaxFencedTuples bounds the tuples the fence state holds. Entries are
// never dropped (a dropped entry would let an old owner in again), so a
// receiver that reached the bound refuses a new tuple's first token.
const MaxFencedTuples = 65536

// maxFenceStateBytes bounds the state file: MaxFencedTuples entries of a
// 64-digit key and a 20-digit value with their JSON.
const maxFenceStateBytes = MaxFencedTuples*96 + 4096

// fenceStateVersion is the version of the state file's format.
const fenceStateVersion = 1

// fenceState is the state file: the highest token per tuple digest.
type fenceState struct {
	Version int               `json:"version"`
	Tokens  map[string]uint64 `json:"tokens"`
}

// ErrFenceState wraps every refusal of the fence state file at start.
var ErrFenceState = errors.New("receiver fence state")

// fences is the highest fencing token per tuple. With no state file
// (path "") it refuses every token: tokens that a restart would forget
// fence nothing.
type fences struct {
	path string
	mu   sync.RWMutex
	high map[string]uint64
}

// openFences loads the state file at path (absent: no token seen yet).
// An empty path keeps no state.
func openFences(path string) (*fences, error) {
	f := &fences{path: path, high: map[string]uint64{}}
	if path == "" {
		return f, nil
	}
	if err := checkFenceDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	removeStaleTemps(filepath.Dir(path))
	st, err := readFenceState(path)
	if err != nil {
		return nil, err
	}
	f.high = st.Tokens
	return f, nil
}

// checkFenceDir refuses a directory others could change the file in.
func checkFenceDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("%w: directory %s: %w", ErrFenceState, dir, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%w: %s is not a directory (a symlink is refused)", ErrFenceState, dir)
	case st.Uid != uint32(os.Geteuid()):
		return fmt.Errorf("%w: directory %s is owned by uid %d, not this process's %d", ErrFenceState, dir, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return fmt.Errorf("%w: directory %s is writable by group or others (mode %#o)", ErrFenceState, dir, st.Mode&0o777)
	}
	return nil
}

// readFenceState reads and strictly decodes the state file, without
// following a symlink; a missing file is an empty state.
func readFenceState(path string) (fenceState, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return fenceState{Version: fenceStateVersion, Tokens: map[string]uint64{}}, nil
	}
	if err != nil {
		return fenceState{}, fmt.Errorf("%w: open %s: %w", ErrFenceState, path, err)
	}
	file := os.NewFile(uintptr(fd), path)
	defer file.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fenceState{}, fmt.Errorf("%w: stat %s: %w", ErrFenceState, path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fenceState{}, fmt.Errorf("%w: %s is not a regular file", ErrFenceState, path)
	case st.Uid != uint32(os.Geteuid()) || st.Mode&0o077 != 0:
		return fenceState{}, fmt.Errorf("%w: %s must be this process's uid and mode 0600 (uid %d, mode %#o)", ErrFenceState, path, st.Uid, st.Mode&0o777)
	}
	data, err := io.ReadAll(io.LimitReader(file, maxFenceStateBytes+1))
	if err != nil {
		return fenceState{}, fmt.Errorf("%w: read %s: %w", ErrFenceState, path, err)
	}
	st2, err := decodeFenceState(data)
	if err != nil {
		return fenceState{}, fmt.Errorf("%w: %s: %w", ErrFenceState, path, err)
	}
	return st2, nil
}

// decodeFenceState strictly decodes and checks a state file's content.
func decodeFenceState(data []byte) (fenceState, error) {
	var st fenceState
	if len(data) > maxFenceStateBytes {
		return st, fmt.Errorf("larger than %d bytes", maxFenceStateBytes)
	}
	if err := strictjson.Decode(data, maxFenceStateBytes, &st); err != nil {
		return fenceState{}, err
	}
	switch {
	case st.Version != fenceStateVersion:
		return fenceState{}, fmt.Errorf("version %d, want %d", st.Version, fenceStateVersion)
	case st.Tokens == nil:
		return fenceState{}, errors.New("tokens missing")
	case len(st.Tokens) > MaxFencedTuples:
		return fenceState{}, fmt.Errorf("%d tuples, more than %d", len(st.Tokens), MaxFencedTuples)
	}
	for d, tok := range st.Tokens {
		if !wire.ValidDigest(d) || tok == 0 {
			return fenceState{}, fmt.Errorf("entry %q: %d: want a tuple digest and a token above 0", d, tok)
		}
	}
	return st, nil
}

// admit checks tok against the highest token seen for tuple. It refuses a
// lower token (and no token, once the tuple has seen one) as fenced; a
// higher one is recorded durably first, and raised reports it. Nothing
// the request does may happen before admit returns nil.
func (f *fences) admit(tuple string, tok uint64) (raised bool, err error) {
	f.mu.RLock()
	cur := f.high[tuple]
	f.mu.RUnlock()
	if tok <= cur {
		return false, fencedBelow(tok, cur)
	}
	if f.path == "" {
		return false, errcode.Errorf(errcode.CodeDenied,
			"this receiver keeps no fence state (fence_state in its config), so it cannot honour a fencing token; a fleet's receivers need one")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, known := f.high[tuple]
	switch {
	case tok <= cur:
		return false, fencedBelow(tok, cur)
	case !known && len(f.high) >= MaxFencedTuples:
		return false, errcode.Errorf(errcode.CodeDenied, "the fence state holds %d tuples, its bound; no new tuple can be fenced", MaxFencedTuples)
	}
	next := maps.Clone(f.high)
	next[tuple] = tok
	if err := writeFenceState(f.path, next); err != nil {
		return false, err
	}
	f.high = next
	return true, nil
}

// fencedBelow is nil when tok equals cur, else the refusal of a token
// below the highest seen.
func fencedBelow(tok, cur uint64) error {
	switch {
	case tok == cur:
		return nil
	case tok == 0:
		return errcode.Errorf(errcode.CodeFenced,
			"the request carries no fencing token, and the tuple is owned by a fleet custodian (token %d); nothing was run", cur)
	}
	return errcode.Errorf(errcode.CodeFenced,
		"fencing token %d is below %d, the highest this receiver has seen for the tuple: another custodian owns the session now; nothing was run", tok, cur)
}

// current returns the highest token seen for tuple.
func (f *fences) current(tuple string) uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.high[tuple]
}

// fenceTempPrefix names the temporary files of writeFenceState.
const fenceTempPrefix = ".fence-state-"

// writeFenceState replaces the state file atomically and durably: a temp
// file in the same directory, synced, renamed over the file, then the
// directory synced. A failure is answered internal and the token is not
// raised.
func writeFenceState(path string, tokens map[string]uint64) error {
	data, err := json.Marshal(fenceState{Version: fenceStateVersion, Tokens: tokens})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, data, 0o600, atomicfile.Options{Temp: fenceTempPrefix + "*.tmp"}); err != nil {
		return fenceWriteError(err)
	}
	return nil
}

func fenceWriteError(err error) error {
	return errcode.Errorf(errcode.CodeInternal, "the receiver could not record the fencing token durably, so the request was not run: %v", err)
}

// removeStaleTemps removes temp files a crash inside writeFenceState left.
func removeStaleTemps(dir string) {
	ms, _ := filepath.Glob(filepath.Join(dir, fenceTempPrefix+"*.tmp"))
	for _, m := range ms {
		os.Remove(m)
	}
}
