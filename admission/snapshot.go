package admission

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// The admission file: where it lives and what its envelope says it holds.
const (
	// PayloadType is the DSSE payload type of the admission file.
	PayloadType = "application/vnd.tether.admission+json"
	// FileName is the admission file's name inside its directory.
	FileName = "admission.dsse.json"
)

// MaxDocumentBytes is the size limit of every admission document this
// package decodes (a snapshot, a publish input); the loader's own limit
// (signedfile.HardMaxBytes) cannot exceed it.
const MaxDocumentBytes = 64 << 20

// MaxGrants bounds the grants in one snapshot; together with the loader's
// size limit it keeps a snapshot cheap to index.
const MaxGrants = 4096

// ErrInvalidGrant is wrapped by every grant validation failure.
var ErrInvalidGrant = errors.New("invalid grant")

// ErrInvalidSnapshot is wrapped by every snapshot or publish input
// validation failure (including one that wraps ErrInvalidGrant).
var ErrInvalidSnapshot = errors.New("invalid snapshot")

// Valid reports whether o is a member of the closed op set.
func (o Op) Valid() bool {
	switch o {
	case OpRead, OpWrite, OpList, OpExec, OpKill:
		return true
	}
	return false
}

// Validate reports the first failed check of g: a valid tuple, uid, gid
// and every supplementary group not 0, a non-empty list of distinct ops from
// the closed set, every limit > 0, and a not_after.
func (g Grant) Validate() error {
	if err := g.Tuple.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidGrant, err)
	}
	if g.UID == 0 || g.GID == 0 {
		return fmt.Errorf("%w: uid %d gid %d: uid and gid 0 are refused", ErrInvalidGrant, g.UID, g.GID)
	}
	for _, gr := range g.Groups {
		if gr == 0 {
			return fmt.Errorf("%w: supplementary group 0 is refused", ErrInvalidGrant)
		}
	}
	if err := validateOps(g.Ops); err != nil {
		return err
	}
	if err := g.Limits.Validate(); err != nil {
		return err
	}
	if g.NotAfter.IsZero() {
		return fmt.Errorf("%w: not_after is required", ErrInvalidGrant)
	}
	return validateEnv(g.Env)
}

// validateEnv checks a grant's env: at most MaxGrantEnv entries, each name
// not empty, free of '=' and NUL and named once, each value free of NUL
// and at most MaxGrantEnvValue bytes.
func validateEnv(env []EnvVar) error {
	if len(env) > MaxGrantEnv {
		return fmt.Errorf("%w: env has %d entries, at most %d", ErrInvalidGrant, len(env), MaxGrantEnv)
	}
	seen := make(map[string]bool, len(env))
	for _, e := range env {
		switch {
		case e.Name == "" || strings.ContainsAny(e.Name, "=\x00"):
			return fmt.Errorf("%w: env name %q is empty or contains '=' or NUL", ErrInvalidGrant, e.Name)
		case seen[e.Name]:
			return fmt.Errorf("%w: env names %s twice", ErrInvalidGrant, e.Name)
		case strings.IndexByte(e.Value, 0) >= 0 || len(e.Value) > MaxGrantEnvValue:
			return fmt.Errorf("%w: env %s: value contains NUL or exceeds %d bytes", ErrInvalidGrant, e.Name, MaxGrantEnvValue)
		}
		seen[e.Name] = true
	}
	return nil
}

func validateOps(ops []Op) error {
	if len(ops) == 0 {
		return fmt.Errorf("%w: ops is empty", ErrInvalidGrant)
	}
	seen := map[Op]bool{}
	for _, o := range ops {
		if !o.Valid() {
			return fmt.Errorf("%w: op %q is not one of read, write, list, exec, kill", ErrInvalidGrant, o)
		}
		if seen[o] {
			return fmt.Errorf("%w: op %q listed twice", ErrInvalidGrant, o)
		}
		seen[o] = true
	}
	return nil
}

// Validate requires the receiver's limits to be > 0 and the computer's
// resource limits to be >= 0 (0: the grant sets no bound).
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"max_procs", int64(l.MaxProcs)},
		{"max_runtime_s", l.MaxRuntimeS},
		{"max_output_bytes", l.MaxOutputBytes},
		{"max_file_bytes", l.MaxFileBytes},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%w: limits.%s must be > 0", ErrInvalidGrant, f.name)
		}
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"max_pids", l.MaxPids},
		{"max_memory_bytes", l.MaxMemoryBytes},
		{"max_disk_bytes", l.MaxDiskBytes},
		{"max_open_files", l.MaxOpenFiles},
		{"max_file_size_bytes", l.MaxFileSizeBytes},
	} {
		if f.v < 0 {
			return fmt.Errorf("%w: limits.%s must be >= 0 (0: no bound)", ErrInvalidGrant, f.name)
		}
	}
	return nil
}

// Validate reports the first failed check of s: generation > 0, a
// not_after, at most MaxGrants grants, each valid, none ending after the
// snapshot, and no tuple granted twice.
func (s Snapshot) Validate() error {
	if s.Generation == 0 {
		return fmt.Errorf("%w: generation must be > 0", ErrInvalidSnapshot)
	}
	return validateBody(s.NotAfter, s.Grants)
}

// validateBody checks what a snapshot and a publish input share.
func validateBody(notAfter time.Time, grants []Grant) error {
	if notAfter.IsZero() {
		return fmt.Errorf("%w: not_after is required", ErrInvalidSnapshot)
	}
	if len(grants) > MaxGrants {
		return fmt.Errorf("%w: %d grants, at most %d", ErrInvalidSnapshot, len(grants), MaxGrants)
	}
	seen := make(map[Tuple]int, len(grants))
	for i, g := range grants {
		if err := g.Validate(); err != nil {
			return fmt.Errorf("%w: grants[%d]: %w", ErrInvalidSnapshot, i, err)
		}
		if g.NotAfter.After(notAfter) {
			return fmt.Errorf("%w: grants[%d]: %w: not_after %s is later than the snapshot's %s",
				ErrInvalidSnapshot, i, ErrInvalidGrant, rfc3339(g.NotAfter), rfc3339(notAfter))
		}
		if j, dup := seen[g.Tuple]; dup {
			return fmt.Errorf("%w: grants[%d]: tuple %s is already granted by grants[%d]",
				ErrInvalidSnapshot, i, g.Tuple.SHA256(), j)
		}
		seen[g.Tuple] = i
	}
	return nil
}

// DecodeSnapshot strictly decodes and validates the payload of an
// admission file. It does not check expiry: that depends on the clock and
// is the loader's job.
func DecodeSnapshot(data []byte) (Snapshot, error) {
	var s Snapshot
	if err := strictjson.Decode(data, MaxDocumentBytes, &s); err != nil {
		return Snapshot{}, fmt.Errorf("%w: %w", ErrInvalidSnapshot, err)
	}
	if err := s.Validate(); err != nil {
		return Snapshot{}, err
	}
	return s, nil
}

// PublishInput is the file `tether-admission publish --grants` reads: a
// snapshot whose generation may be omitted (the publisher then uses the
// current generation + 1). docs/admission.md documents it.
type PublishInput struct {
	Generation *uint64   `json:"generation,omitempty"`
	NotAfter   time.Time `json:"not_after"`
	Grants     []Grant   `json:"grants"`
}

// Validate reports the first failed check: a given generation must be > 0,
// and the rest as Snapshot.Validate.
func (in PublishInput) Validate() error {
	if in.Generation != nil && *in.Generation == 0 {
		return fmt.Errorf("%w: generation must be > 0 when given", ErrInvalidSnapshot)
	}
	return validateBody(in.NotAfter, in.Grants)
}

// DecodePublishInput strictly decodes and validates a publish input.
func DecodePublishInput(data []byte) (PublishInput, error) {
	var in PublishInput
	if err := strictjson.Decode(data, MaxDocumentBytes, &in); err != nil {
		return PublishInput{}, fmt.Errorf("%w: %w", ErrInvalidSnapshot, err)
	}
	if err := in.Validate(); err != nil {
		return PublishInput{}, err
	}
	return in, nil
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
