// Package acpmeta is the ACP-level contract shared by the plugin (agent
// side) and the custodian (client side): the `_meta` keys that opt a session
// in and tag every callback, the `_tether/attach` extension method, and the
// JSON-RPC error shape whose data carries a tether code (ErrorCode, DataKey;
// admission/acperr builds and reads the ACP SDK's error of that shape). It
// is a leaf of the shared contract: besides the standard library it imports
// only admission (the tuple), admission/errcode and admission/strictjson.
package acpmeta

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/strictjson"
)

// Keys and method names of the contract.
const (
	// KeyBind is the session/new or session/load `_meta` key that opts in.
	KeyBind = "tether/bind"
	// KeyOp is the `_meta` key every fs/* and terminal/* request carries.
	KeyOp = "tether/op"
	// MethodAttach is the agent -> client extension method.
	MethodAttach = "_tether/attach"
	// DataKey is the key of the JSON-RPC error data that holds the code.
	DataKey = "tether"
	// ErrorCode is the JSON-RPC error code of every tether refusal; callers
	// branch on the data's tether code, not on this number.
	ErrorCode = -32010
)

// ErrMeta is wrapped by every malformed or missing `_meta` entry.
var ErrMeta = errors.New("tether meta")

// Bind is the value of `_meta["tether/bind"]`.
type Bind struct {
	Tuple         admission.Tuple `json:"tuple"`
	LeaseNotAfter time.Time       `json:"lease_not_after"`
}

// Op is the value of `_meta["tether/op"]`.
type Op struct {
	TupleSHA256 string    `json:"tuple_sha256"`
	OpKey       string    `json:"op_key"`
	Deadline    time.Time `json:"deadline"`
}

// AttachRequest is the params of `_tether/attach`.
type AttachRequest struct {
	SessionID   string `json:"session_id"`
	TupleSHA256 string `json:"tuple_sha256"`
}

// AttachResponse is the result of `_tether/attach`.
type AttachResponse struct {
	LeaseNotAfter   time.Time `json:"lease_not_after"`
	GrantGeneration uint64    `json:"grant_generation"`
}

// ValidOpKey reports whether k is a well-formed operation key: 1 to 128
// bytes of [A-Za-z0-9._:-]. It runs on every callback, so it is a loop,
// not a regexp (TestValidMatchesPattern checks it against
// ^[A-Za-z0-9._:-]{1,128}$).
func ValidOpKey(k string) bool {
	if len(k) == 0 || len(k) > 128 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// ValidDigest reports whether d is a lowercase hex SHA-256: exactly 64
// bytes of [0-9a-f] (TestValidMatchesPattern checks it against
// ^[0-9a-f]{64}$).
func ValidDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// BindFromMeta returns the bind request in meta. ok is false when the key
// is absent; a present but malformed or invalid value is an error, never a
// silent "not bound".
func BindFromMeta(meta map[string]any) (b Bind, ok bool, err error) {
	raw, ok := meta[KeyBind]
	if !ok {
		return Bind{}, false, nil
	}
	if err := remarshal(raw, &b); err != nil {
		return Bind{}, true, fmt.Errorf("%w: %s: %w", ErrMeta, KeyBind, err)
	}
	if err := b.Tuple.Validate(); err != nil {
		return Bind{}, true, fmt.Errorf("%w: %s: %w", ErrMeta, KeyBind, err)
	}
	if b.LeaseNotAfter.IsZero() {
		return Bind{}, true, fmt.Errorf("%w: %s: lease_not_after is required", ErrMeta, KeyBind)
	}
	return b, true, nil
}

// Meta returns b as a `_meta` map.
func (b Bind) Meta() map[string]any { return map[string]any{KeyBind: b} }

// OpFromMeta returns the op tag in meta; a missing or malformed tag is an
// error that wraps ErrMeta.
func OpFromMeta(meta map[string]any) (Op, error) {
	raw, ok := meta[KeyOp]
	if !ok {
		return Op{}, fmt.Errorf("%w: %s missing", ErrMeta, KeyOp)
	}
	o, ok := opFast(raw)
	if !ok {
		if err := remarshal(raw, &o); err != nil {
			return Op{}, fmt.Errorf("%w: %s: %w", ErrMeta, KeyOp, err)
		}
	}
	switch {
	case !ValidDigest(o.TupleSHA256):
		return Op{}, fmt.Errorf("%w: %s: tuple_sha256 is not a lowercase hex SHA-256", ErrMeta, KeyOp)
	case !ValidOpKey(o.OpKey):
		return Op{}, fmt.Errorf("%w: %s: op_key is not 1-128 of [A-Za-z0-9._:-]", ErrMeta, KeyOp)
	case o.Deadline.IsZero():
		return Op{}, fmt.Errorf("%w: %s: deadline is required", ErrMeta, KeyOp)
	}
	return o, nil
}

// Meta returns o as a `_meta` map.
func (o Op) Meta() map[string]any { return map[string]any{KeyOp: o} }

// opFast decodes the op tag as every callback's decoded JSON carries it (a
// map of its three fields, each a string) without encoding it back to
// JSON; it reports false for any other shape, which remarshal then decodes
// (and refuses) exactly as before: the result is the same either way
// (FuzzOpFast), only cheaper on the hot path.
func opFast(raw any) (Op, bool) {
	m, ok := raw.(map[string]any)
	if !ok || len(m) > 3 {
		return Op{}, false
	}
	var o Op
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			return Op{}, false
		}
		switch k {
		case "tuple_sha256":
			o.TupleSHA256 = s
		case "op_key":
			o.OpKey = s
		case "deadline":
			if o.Deadline.UnmarshalText([]byte(s)) != nil {
				return Op{}, false
			}
		default:
			return Op{}, false
		}
	}
	return o, true
}

// MaxValueBytes bounds one `_meta` value as JSON (the largest, a verify
// request of MaxVerifyFiles paths, is far smaller).
const MaxValueBytes = 1 << 20

// remarshal turns a decoded `_meta` value back into a typed struct with the
// one strict decoder (admission/strictjson): unknown, case-folded and
// duplicate keys are refused.
func remarshal(v any, out any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return strictjson.Decode(data, MaxValueBytes, out)
}
