// Package admission is the admission contract every room shares: the
// allocation tuple, the grants that admit it, the snapshot that lists them
// and the strict decoding of each. It is a leaf: it imports only the
// standard library, so the plugin and agent runtimes can name a tuple
// without linking the admission file's machinery. That machinery (publish,
// trust, load, refresh) is admission/signedfile; the coordinator that
// renews the real lease before it publishes is admission/coordinator.
package admission

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// Tuple is the immutable nine-field allocation a session binds to. Every
// field is required; see Validate. The JSON names are the wire names.
type Tuple struct {
	Owner      string `json:"owner"`
	Allocation string `json:"allocation"`
	Session    string `json:"session"`
	Workspace  string `json:"workspace"`
	Sandbox    string `json:"sandbox"`
	Generation uint64 `json:"generation"`
	Executor   string `json:"executor"`
	Site       string `json:"site"`
	Root       string `json:"root"`
}

// ErrInvalidTuple is wrapped by every tuple validation failure.
var ErrInvalidTuple = errors.New("invalid tuple")

// maxFieldLen bounds every string field so a tuple cannot be used to
// smuggle large payloads through metadata.
const maxFieldLen = 1024

// fields returns the nine name=value pairs in the order DESIGN.md fixes.
func (t Tuple) fields() [9][2]string {
	return [9][2]string{
		{"owner", t.Owner},
		{"allocation", t.Allocation},
		{"session", t.Session},
		{"workspace", t.Workspace},
		{"sandbox", t.Sandbox},
		{"generation", strconv.FormatUint(t.Generation, 10)},
		{"executor", t.Executor},
		{"site", t.Site},
		{"root", t.Root},
	}
}

// Validate reports the first failed check: every field present, no NUL or
// newline, bounded length, generation > 0, and root an absolute clean path.
func (t Tuple) Validate() error {
	for _, f := range t.fields() {
		name, v := f[0], f[1]
		switch {
		case name == "generation" && t.Generation == 0:
			return fmt.Errorf("%w: generation must be > 0", ErrInvalidTuple)
		case v == "":
			return fmt.Errorf("%w: %s is required", ErrInvalidTuple, name)
		case strings.ContainsAny(v, "\x00\n\r"):
			return fmt.Errorf("%w: %s contains NUL or newline", ErrInvalidTuple, name)
		case len(v) > maxFieldLen:
			return fmt.Errorf("%w: %s longer than %d bytes", ErrInvalidTuple, name, maxFieldLen)
		}
	}
	if !path.IsAbs(t.Root) || path.Clean(t.Root) != t.Root {
		return fmt.Errorf("%w: root %q is not an absolute clean path", ErrInvalidTuple, t.Root)
	}
	return nil
}

// Canonical returns the nine "name=value\n" lines that SHA256 hashes.
func (t Tuple) Canonical() []byte {
	var b bytes.Buffer
	for _, f := range t.fields() {
		b.WriteString(f[0])
		b.WriteByte('=')
		b.WriteString(f[1])
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// SHA256 returns the lowercase hex SHA-256 of Canonical: the tuple_sha256
// that every request carries.
func (t Tuple) SHA256() string {
	sum := sha256.Sum256(t.Canonical())
	return hex.EncodeToString(sum[:])
}

// Equal reports whether all nine fields are identical.
func (t Tuple) Equal(o Tuple) bool { return t == o }

// maxTupleBytes bounds a JSON tuple: nine fields of at most maxFieldLen
// bytes, each escaped at worst six bytes a byte, and the keys.
const maxTupleBytes = 9*6*maxFieldLen + 1024

// DecodeTuple strictly decodes one JSON tuple (admission/strictjson):
// unknown or duplicate keys, trailing data and a missing or invalid field
// are refused.
func DecodeTuple(data []byte) (Tuple, error) {
	var t Tuple
	if err := strictjson.Decode(data, maxTupleBytes, &t); err != nil {
		return Tuple{}, fmt.Errorf("%w: %w", ErrInvalidTuple, err)
	}
	if err := t.Validate(); err != nil {
		return Tuple{}, err
	}
	return t, nil
}

// Lease is a tuple together with the instant its lease ends.
type Lease struct {
	Tuple    Tuple     `json:"tuple"`
	NotAfter time.Time `json:"not_after"`
}

// ErrTupleChanged is returned when a lease update names a different tuple.
var ErrTupleChanged = errors.New("tuple changed")

// ErrLeaseNotLater is returned when a lease update does not move not_after
// forward.
var ErrLeaseNotLater = errors.New("lease extension not later")

// Extend accepts next only when it names the identical tuple with a later
// not_after, and returns the extended lease. Anything else is refused and
// the current lease is kept.
func (l Lease) Extend(next Lease) (Lease, error) {
	if !l.Tuple.Equal(next.Tuple) {
		return l, fmt.Errorf("lease extension: %w (tuple_sha256 %s != %s)",
			ErrTupleChanged, next.Tuple.SHA256(), l.Tuple.SHA256())
	}
	if !next.NotAfter.After(l.NotAfter) {
		return l, fmt.Errorf("lease extension: %w (%s is not after %s)", ErrLeaseNotLater,
			next.NotAfter.UTC().Format(time.RFC3339), l.NotAfter.UTC().Format(time.RFC3339))
	}
	return next, nil
}
