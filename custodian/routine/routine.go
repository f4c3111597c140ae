// Package routine keeps the custodian's routines: a routine is a template
// saved from a verified exec receipt (the argv, the cwd relative to the
// tuple root, the env and the files to verify with their expected
// digests), which a later run submits again, with a fresh operation key,
// through the same custody path as any exec: admission, the session's
// current tuple, the op key store and a receipt. A template holds no
// tuple, no grant and no schedule: nothing runs from it unless a caller
// asks for one run on a session it has bound (docs/decisions.md
// "Routines are templates, not permissions").
package routine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/custodian/opstore"
)

// MethodTerminalCreate is the ACP method of the receipts a routine can be
// saved from (acp.ClientMethodTerminalCreate, spelled here so this package
// needs no ACP SDK).
const MethodTerminalCreate = "terminal/create"

// Version is the template format this package writes and reads.
const Version = 1

// Errors a caller branches on; each refusal wraps one and names the
// failed check.
var (
	// ErrBadName: the name is not in the closed character set.
	ErrBadName = errors.New("routine: bad name")
	// ErrUnknownOpKey: no receipt has the op key.
	ErrUnknownOpKey = errors.New("routine: unknown op key")
	// ErrNotExec: the receipt is not an exec (terminal/create) receipt
	// that recorded what it ran.
	ErrNotExec = errors.New("routine: receipt is not an exec")
	// ErrNotVerified: the receipt's outcome is not verified.
	ErrNotVerified = errors.New("routine: receipt is not verified")
	// ErrOtherOwner: the receipt belongs to another owner.
	ErrOtherOwner = errors.New("routine: receipt belongs to another owner")
	// ErrExists: a routine of that name exists and replacing it was not
	// asked for.
	ErrExists = errors.New("routine: name exists")
	// ErrNotFound: no routine has that name.
	ErrNotFound = errors.New("routine: not found")
	// ErrCorrupt: a stored template does not decode or check.
	ErrCorrupt = errors.New("routine: corrupt template")
)

// nameRE is the closed character set of routine names: they are file
// names in the routines directory, so no "/", no leading "." and no
// ".." can occur.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// ValidName reports whether name is a well-formed routine name: 1 to 64
// characters of a-z, 0-9, "_" and "-", starting with a letter or digit.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// CheckName returns nil for a valid name, else an error wrapping
// ErrBadName.
func CheckName(name string) error {
	if !ValidName(name) {
		return fmt.Errorf("%w: %q must match %s", ErrBadName, name, nameRE)
	}
	return nil
}

// Source is the receipt a template was saved from.
type Source struct {
	OpKey         string `json:"op_key"`
	RequestSHA256 string `json:"request_sha256"`
	SessionID     string `json:"session_id"`
	TupleSHA256   string `json:"tuple_sha256"`
}

// Template is one saved routine: exactly what a re-run needs, and where it
// came from. It holds no tuple: a run uses the session's current binding.
type Template struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	// Owner is the principal the source receipt was recorded for; only
	// the same owner's sessions run it.
	Owner string `json:"owner"`
	// Argv is the command line as the receiver exec'd it (a shell line
	// is ["/bin/sh", "-c", LINE]).
	Argv []string `json:"argv"`
	// Cwd is the working directory relative to the tuple's root ("." is
	// the root).
	Cwd string            `json:"cwd"`
	Env map[string]string `json:"env,omitempty"`
	// Verify maps each file to check after exit (relative to the root) to
	// its expected lowercase hex SHA-256, so a run can be verified again.
	Verify  map[string]string `json:"verify"`
	Source  Source            `json:"source"`
	SavedAt time.Time         `json:"saved_at"`
}

// FromReceipt builds the template name saved from r for owner. It refuses,
// naming the failed check, a receipt that is not an exec that recorded
// what it ran (ErrNotExec), whose outcome is not verified
// (ErrNotVerified), or whose principal is not owner (ErrOtherOwner).
func FromReceipt(name, owner string, r *opstore.Receipt, now time.Time) (*Template, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	switch {
	case r.Method != MethodTerminalCreate:
		return nil, fmt.Errorf("%w: op key %s is a %s receipt, not %s", ErrNotExec, r.OpKey, r.Method, MethodTerminalCreate)
	case r.Exec == nil:
		return nil, fmt.Errorf("%w: the receipt of op key %s does not record what it ran (recorded by an older custodian)", ErrNotExec, r.OpKey)
	case r.Outcome != opstore.Verified:
		return nil, fmt.Errorf("%w: op key %s has outcome %s", ErrNotVerified, r.OpKey, r.Outcome)
	case r.Principal != owner:
		return nil, fmt.Errorf("%w: op key %s was recorded for %q, the caller is %q", ErrOtherOwner, r.OpKey, r.Principal, owner)
	}
	verify := make(map[string]string, len(r.Files))
	for _, f := range r.Files {
		verify[f.Path] = f.Expected
	}
	t := &Template{Version: Version, Name: name, Owner: owner,
		Argv: append([]string(nil), r.Exec.Argv...), Cwd: r.Exec.Cwd, Env: copyMap(r.Exec.Env), Verify: verify,
		Source:  Source{OpKey: r.OpKey, RequestSHA256: r.RequestSHA256, SessionID: r.SessionID, TupleSHA256: r.TupleSHA256},
		SavedAt: now.UTC()}
	if err := t.Check(); err != nil {
		return nil, err
	}
	return t, nil
}

func copyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Check validates every field of t; an error wraps ErrCorrupt or
// ErrBadName.
func (t *Template) Check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %q: "+format, append([]any{ErrCorrupt, t.Name}, args...)...)
	}
	if err := CheckName(t.Name); err != nil {
		return err
	}
	switch {
	case t.Version != Version:
		return bad("version %d, want %d", t.Version, Version)
	case t.Owner == "" || strings.ContainsAny(t.Owner, "\x00\n"):
		return bad("owner is empty or holds NUL or newline")
	case len(t.Argv) == 0 || t.Argv[0] == "":
		return bad("argv is empty")
	case !cleanRel(t.Cwd):
		return bad("cwd %q is not a clean path relative to the root", t.Cwd)
	case len(t.Verify) == 0:
		return bad("verify names no file: a routine is saved only from a verified exec")
	case !acpmeta.ValidOpKey(t.Source.OpKey) || !acpmeta.ValidDigest(t.Source.RequestSHA256):
		return bad("source op key or request digest is malformed")
	}
	if err := (acpmeta.Verify{Files: t.Verify}).Validate(); err != nil {
		return bad("verify: %v", err)
	}
	return nil
}

// cleanRel reports whether p is "." or a clean relative path that stays
// beneath the root.
func cleanRel(p string) bool {
	return p == "." || (p != "" && !path.IsAbs(p) && path.Clean(p) == p && p != ".." &&
		!strings.HasPrefix(p, "../") && !strings.ContainsRune(p, 0))
}

// maxTemplateBytes bounds a stored template.
const maxTemplateBytes = 1 << 20

// Marshal returns t's stored bytes: its JSON (maps in key order, no HTML
// escaping, so a shell line reads as written, no trailing newline), so
// equal templates have equal bytes.
func (t *Template) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(t); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Digest is the lowercase hex SHA-256 of t's stored bytes: what the audit
// log records for a save and for each run.
func (t *Template) Digest() (string, error) {
	data, err := t.Marshal()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// Unmarshal decodes stored template bytes strictly and checks them.
func Unmarshal(data []byte) (*Template, error) {
	var t Template
	if err := strictjson.Decode(data, maxTemplateBytes, &t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err := t.Check(); err != nil {
		return nil, err
	}
	return &t, nil
}
