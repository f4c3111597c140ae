package receiver

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// Limits are the receiver's own bounds. A grant's limits apply within
// them: the effective bound of each is the smaller of the two.
type Limits struct {
	// MaxFileBytes bounds a file read, written or hashed.
	MaxFileBytes int64 `json:"max_file_bytes"`
	// MaxOutputBytes bounds the output kept per command (at most
	// HardMaxOutputBytes, so an answer always fits in a frame).
	MaxOutputBytes int64 `json:"max_output_bytes"`
	// MaxRuntime bounds a command's life, in seconds.
	MaxRuntimeS int64 `json:"max_runtime_s"`
	// MaxListEntries bounds one directory listing.
	MaxListEntries int `json:"max_list_entries"`
	// MaxHashPaths bounds the paths of one hash or hash_after_exit.
	MaxHashPaths int `json:"max_hash_paths"`
	// MaxTerminals bounds the terminals (running or not yet released)
	// the receiver keeps for all tuples together.
	MaxTerminals int `json:"max_terminals"`
	// MaxTerminalsPerTuple bounds the terminals one tuple keeps, so one
	// session cannot take every slot from the others.
	MaxTerminalsPerTuple int `json:"max_terminals_per_tuple"`
	// OrphanGraceS is how long, in seconds, a command whose connection
	// ended waits for a reattach before it is killed and forgotten
	// (docs/protocol.md "Processes").
	OrphanGraceS int64 `json:"orphan_grace_s"`
	// MaxResultBytes bounds one encoded result; it must leave room for
	// the response envelope within the wire's frame limit.
	MaxResultBytes int `json:"max_result_bytes"`
}

// DefaultLimits are used for every zero field of Limits (the per-tuple
// terminals and the orphan grace at most max_terminals and max_runtime_s).
var DefaultLimits = Limits{
	MaxFileBytes:   64 << 20,
	MaxOutputBytes: 64 << 10,
	MaxRuntimeS:    3600,
	MaxListEntries: 4096,
	MaxHashPaths:   256,
	MaxTerminals:   256,
	MaxResultBytes: 1<<20 - 4<<10,

	MaxTerminalsPerTuple: 64,
	OrphanGraceS:         30,
}

// HardMaxOutputBytes keeps every exec_output answer within a frame even
// when each byte is escaped as \u00XX (6 bytes).
const HardMaxOutputBytes = 128 << 10

// HardMaxResultBytes is the wire's frame limit less room for the envelope.
const HardMaxResultBytes = 1<<20 - 4<<10

// ErrLimits wraps every invalid Limits value.
var ErrLimits = errors.New("receiver limits")

func (l Limits) withDefaults() (Limits, error) {
	d := DefaultLimits
	if l.MaxFileBytes != 0 {
		d.MaxFileBytes = l.MaxFileBytes
	}
	if l.MaxOutputBytes != 0 {
		d.MaxOutputBytes = l.MaxOutputBytes
	}
	if l.MaxRuntimeS != 0 {
		d.MaxRuntimeS = l.MaxRuntimeS
	}
	if l.MaxListEntries != 0 {
		d.MaxListEntries = l.MaxListEntries
	}
	if l.MaxHashPaths != 0 {
		d.MaxHashPaths = l.MaxHashPaths
	}
	if l.MaxTerminals != 0 {
		d.MaxTerminals = l.MaxTerminals
	}
	if l.MaxResultBytes != 0 {
		d.MaxResultBytes = l.MaxResultBytes
	}
	d.MaxTerminalsPerTuple = cmp.Or(l.MaxTerminalsPerTuple, min(d.MaxTerminalsPerTuple, d.MaxTerminals))
	d.OrphanGraceS = cmp.Or(l.OrphanGraceS, min(d.OrphanGraceS, d.MaxRuntimeS))
	return d, d.validate()
}

func (l Limits) validate() error {
	switch {
	case l.MaxFileBytes < 0 || l.MaxRuntimeS < 0 || l.MaxListEntries < 0 || l.MaxHashPaths < 0 || l.MaxTerminals < 0:
		return fmt.Errorf("%w: negative limit", ErrLimits)
	case l.MaxOutputBytes < 0 || l.MaxOutputBytes > HardMaxOutputBytes:
		return fmt.Errorf("%w: max_output_bytes %d not in 1..%d", ErrLimits, l.MaxOutputBytes, HardMaxOutputBytes)
	case l.MaxResultBytes < 64<<10 || l.MaxResultBytes > HardMaxResultBytes:
		return fmt.Errorf("%w: max_result_bytes %d not in %d..%d", ErrLimits, l.MaxResultBytes, 64<<10, HardMaxResultBytes)
	case l.MaxTerminalsPerTuple < 0 || l.MaxTerminalsPerTuple > l.MaxTerminals:
		return fmt.Errorf("%w: max_terminals_per_tuple %d not in 1..max_terminals (%d)", ErrLimits, l.MaxTerminalsPerTuple, l.MaxTerminals)
	case l.OrphanGraceS < 0 || l.OrphanGraceS > l.MaxRuntimeS:
		return fmt.Errorf("%w: orphan_grace_s %d not in 1..max_runtime_s (%d)", ErrLimits, l.OrphanGraceS, l.MaxRuntimeS)
	}
	return nil
}

func (l Limits) maxRuntime() time.Duration { return time.Duration(l.MaxRuntimeS) * time.Second }

func (l Limits) orphanGrace() time.Duration { return time.Duration(l.OrphanGraceS) * time.Second }

// min64 returns the smallest positive value of vs (0 when none is).
func min64(vs ...int64) int64 {
	var m int64
	for _, v := range vs {
		if v > 0 && (m == 0 || v < m) {
			m = v
		}
	}
	return m
}
