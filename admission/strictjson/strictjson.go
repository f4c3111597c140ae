// Package strictjson is tether's one strict JSON decoder: every document
// tether parses (wire frames, admission files, signed envelopes, `_meta`
// values, configs, stored records) goes through Decode or Read, so a
// document has exactly one reading wherever it is read.
//
// Beyond encoding/json it refuses what encoding/json quietly accepts:
// duplicate keys at any depth (encoding/json keeps the last, other parsers
// the first), keys that match a field only case-insensitively, unknown
// fields, invalid UTF-8 (encoding/json replaces it), nesting deeper than
// MaxDepth, anything after the one top-level object, and input larger than
// the caller's limit. Keys are compared after unescaping, as encoding/json
// sees them, so "\u0061" and "a" are the same key.
//
// It is a leaf of the shared contract: it imports only the standard
// library.
package strictjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
)

// MaxDepth is the one nesting bound of every tether document: an object or
// array inside MaxDepth others is refused. The deepest legitimate shape,
// a wire request holding exec_start args with an env map, nests 3 levels;
// an admission snapshot nests 4 (snapshot, grants, grant, tuple).
const MaxDepth = 16

// Sentinels: every refusal wraps ErrInvalid and the sentinel of the check
// that failed, so callers branch with errors.Is on either.
var (
	ErrInvalid      = errors.New("strict json")
	ErrTooLarge     = errors.New("larger than the size limit")
	ErrSyntax       = errors.New("not one well-formed JSON object") // also invalid UTF-8
	ErrDuplicateKey = errors.New("duplicate key")
	ErrUnknownField = errors.New("unknown field") // also a key that matches a field only case-insensitively
	ErrTooDeep      = fmt.Errorf("nested deeper than %d", MaxDepth)
	ErrTrailingData = errors.New("trailing data after the object")
	ErrType         = errors.New("value does not fit the field") // encoding/json's type errors
)

// Error is a refusal: the failed check (one of the sentinels), the key it
// failed on (for a duplicate or unknown key), where in the document (a path
// such as `.grants[0].tuple`, empty at the top level) and the cause, if any.
type Error struct {
	Check  error
	Key    string
	Path   string
	Detail string
	Err    error
}

// Error names the check, the key, the place and the detail, as in
// `strict json: unknown field "fallback" at ".grants[0]"`.
func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: %s", ErrInvalid, e.Check)
	if e.Check == ErrDuplicateKey || e.Check == ErrUnknownField {
		msg += fmt.Sprintf(" %q", e.Key)
	}
	if e.Path != "" {
		msg += fmt.Sprintf(" at %q", e.Path)
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap exposes ErrInvalid, the check's sentinel and the cause.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalid, e.Check, e.Err}
	}
	return []error{ErrInvalid, e.Check}
}

func refuseKey(check error, path, key string) *Error {
	return &Error{Check: check, Key: key, Path: path}
}

func refuse(check error, path, format string, args ...any) *Error {
	return &Error{Check: check, Path: path, Detail: fmt.Sprintf(format, args...)}
}

// Decode decodes data, which must be exactly one JSON object of at most
// maxBytes bytes, into v, a non-nil pointer. A struct's fields match only
// by their exact JSON name. A field of a type with its own UnmarshalJSON,
// of type json.RawMessage or of an interface type is checked for duplicate
// keys and depth only: its own decoder (or a later Decode) owns its shape.
// Every error is an *Error.
func Decode(data []byte, maxBytes int, v any) error {
	if err := precheck(data, maxBytes, v); err != nil {
		return err
	}
	if err := check(data, reflect.TypeOf(v)); err != nil {
		return err
	}
	return unmarshal(data, v)
}

// precheck refuses a missing or exceeded size limit and a target that is
// not a non-nil pointer.
func precheck(data []byte, maxBytes int, v any) error {
	if maxBytes <= 0 {
		return refuse(ErrTooLarge, "", "no size limit given")
	}
	if len(data) > maxBytes {
		return refuse(ErrTooLarge, "", "%d bytes, at most %d", len(data), maxBytes)
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return refuse(ErrType, "", "decode target is %T, not a non-nil pointer", v)
	}
	return nil
}

// unmarshal decodes data, which check admitted, into v.
func unmarshal(data []byte, v any) error {
	// The scan admitted exactly the type's own field names, so Unmarshal
	// (which also validates every value it skipped) decodes no more.
	if err := json.Unmarshal(data, v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return &Error{Check: ErrSyntax, Err: err}
		}
		return &Error{Check: ErrType, Err: err}
	}
	return nil
}

// DecodeWithRaw is Decode, except that the value of the top-level member
// named key is not decoded: it is returned as raw, a slice of data, and
// the rest of the object is decoded into v as Decode would, with that
// member's value read as null (its field keeps its zero value; a
// json.RawMessage field holds "null"). raw is nil when the member is
// absent. Like a json.RawMessage field under Decode, raw is checked for
// duplicate keys and depth only: the caller decodes it strictly (with
// Decode, against its own type) or checks it with json.Valid before it
// trusts it. This spares a large member, such as a frame's args or result,
// the whole-document pass of json.Unmarshal that would only copy it.
func DecodeWithRaw(data []byte, maxBytes int, v any, key string) (raw []byte, err error) {
	if err := precheck(data, maxBytes, v); err != nil {
		return nil, err
	}
	start, end, err := checkSpan(data, reflect.TypeOf(v), key)
	if err != nil {
		return nil, err
	}
	env := data
	if start >= 0 {
		raw = data[start:end]
		env = make([]byte, 0, len(data)-len(raw)+4)
		env = append(append(append(env, data[:start]...), "null"...), data[end:]...)
	}
	return raw, unmarshal(env, v)
}

// Read reads r to its end, refusing more than maxBytes, and decodes what it
// read with Decode. The caller closes r.
func Read(r io.Reader, maxBytes int, v any) error {
	if maxBytes <= 0 {
		return refuse(ErrTooLarge, "", "no size limit given")
	}
	data, err := io.ReadAll(io.LimitReader(r, int64(maxBytes)+1))
	if err != nil {
		return fmt.Errorf("%w: read: %w", ErrInvalid, err)
	}
	return Decode(data, maxBytes, v)
}
