package admission

import (
	"context"
	"errors"
	"time"
)

// Op is one operation a grant may allow.
type Op string

// The closed set of grant ops. A receiver op maps onto one of these:
// read and stat and hash need read; write needs write; list needs list;
// exec_start/output/wait/release need exec; exec_kill needs kill.
const (
	OpRead  Op = "read"
	OpWrite Op = "write"
	OpList  Op = "list"
	OpExec  Op = "exec"
	OpKill  Op = "kill"
)

// Limits bound what a grant's holder may consume. The first four are the
// receiver's, checked per request; the resource limits after them bound
// the whole computer (every process of the grant's uid together) and are
// enforced by the computer the receiver runs in, which the receiver
// checks before every command (docs/admission.md): 0 (absent) means the
// grant sets no such bound.
type Limits struct {
	MaxProcs       int   `json:"max_procs"`
	MaxRuntimeS    int64 `json:"max_runtime_s"`
	MaxOutputBytes int64 `json:"max_output_bytes"`
	MaxFileBytes   int64 `json:"max_file_bytes"`

	// MaxPids bounds the computer's processes and threads (pids.max and
	// RLIMIT_NPROC).
	MaxPids int64 `json:"max_pids,omitempty"`
	// MaxMemoryBytes bounds the computer's memory, swap excluded
	// (memory.max with no swap).
	MaxMemoryBytes int64 `json:"max_memory_bytes,omitempty"`
	// MaxDiskBytes bounds the root's file system.
	MaxDiskBytes int64 `json:"max_disk_bytes,omitempty"`
	// MaxOpenFiles bounds each process's descriptors (RLIMIT_NOFILE).
	MaxOpenFiles int64 `json:"max_open_files,omitempty"`
	// MaxFileSizeBytes bounds each file a process writes (RLIMIT_FSIZE).
	MaxFileSizeBytes int64 `json:"max_file_size_bytes,omitempty"`
}

// Grant admits one tuple: the unprivileged identity its children run as,
// the ops it may use, its limits, and when it ends (never after the
// snapshot's not_after, nor the lease's).
type Grant struct {
	Tuple    Tuple     `json:"tuple"`
	UID      uint32    `json:"uid"`
	GID      uint32    `json:"gid"`
	Groups   []uint32  `json:"groups"`
	Ops      []Op      `json:"ops"`
	Limits   Limits    `json:"limits"`
	NotAfter time.Time `json:"not_after"`
	// Env is merged over the receiver's default environment for the
	// grant's commands (a request's own env is merged over it); nil adds
	// nothing. A list of name/value pairs, as ACP writes an environment
	// (every key of the admission file is a field's exact name, so names cannot be
	// keys). The receiver refuses loader variables at exec time.
	Env []EnvVar `json:"env,omitempty"`
}

// EnvVar is one environment variable of a grant.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// MaxGrantEnv bounds a grant's env entries; MaxGrantEnvValue one value.
const (
	MaxGrantEnv      = 64
	MaxGrantEnvValue = 4096
)

// Allows reports whether g lists op.
func (g Grant) Allows(op Op) bool {
	for _, o := range g.Ops {
		if o == op {
			return true
		}
	}
	return false
}

// Snapshot is the signed payload of the admission file.
type Snapshot struct {
	Generation uint64    `json:"generation"`
	NotAfter   time.Time `json:"not_after"`
	Grants     []Grant   `json:"grants"`
}

// Errors a GrantSource returns; callers branch on them with errors.Is.
var (
	// ErrNoGrant: no grant in the current snapshot covers the tuple.
	ErrNoGrant = errors.New("no grant covers the tuple")
	// ErrGrantExpired: the covering grant, or the snapshot, has passed not_after.
	ErrGrantExpired = errors.New("grant expired")
	// ErrOpNotAllowed: the covering grant does not list the op.
	ErrOpNotAllowed = errors.New("op not allowed by grant")
)

// GrantSource answers, at request time, "the current grant for the tuple
// with this digest, allowing op". The receiver calls it on every request;
// the admission Refresher implements it. Any error means refuse: there is
// no cached or inline fallback. generation is the snapshot's.
type GrantSource interface {
	Lookup(ctx context.Context, tupleSHA256 string, op Op) (g Grant, generation uint64, err error)
}
