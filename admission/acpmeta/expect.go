package acpmeta

import (
	"fmt"
	"maps"
)

// KeyExpect is the `_meta` key of an fs/write_text_file request that must
// only land when the file's current content has the given SHA-256: the
// plugin's edit_text_file reads, replaces, then writes with this
// precondition so that no concurrent update is lost. The custodian honours
// it by setting receiver/wire.WriteArgs.ExpectSHA256 (or ExpectAbsent), so
// the check and the write are one atomic step in the receiver; a mismatch
// is refused with code precondition_failed.
const KeyExpect = "tether/expect"

// Expect is the value of `_meta["tether/expect"]`. Exactly one of SHA256
// (lowercase hex) and Absent is set.
type Expect struct {
	SHA256 string `json:"sha256,omitempty"`
	Absent bool   `json:"absent,omitempty"`
}

// Validate reports whether e names exactly one precondition.
func (e Expect) Validate() error {
	switch {
	case e.Absent && e.SHA256 != "":
		return fmt.Errorf("%w: %s: sha256 and absent are exclusive", ErrMeta, KeyExpect)
	case !e.Absent && !ValidDigest(e.SHA256):
		return fmt.Errorf("%w: %s: sha256 is not a lowercase hex SHA-256", ErrMeta, KeyExpect)
	}
	return nil
}

// ExpectFromMeta returns the write precondition in meta. ok is false when
// the key is absent; a present but malformed value is an error.
func ExpectFromMeta(meta map[string]any) (e Expect, ok bool, err error) {
	raw, ok := meta[KeyExpect]
	if !ok {
		return Expect{}, false, nil
	}
	if err := remarshal(raw, &e); err != nil {
		return Expect{}, true, fmt.Errorf("%w: %s: %w", ErrMeta, KeyExpect, err)
	}
	if err := e.Validate(); err != nil {
		return Expect{}, true, err
	}
	return e, true, nil
}

// Meta returns e as a `_meta` map.
func (e Expect) Meta() map[string]any { return map[string]any{KeyExpect: e} }

// MergeMeta returns one `_meta` map holding every entry of ms; a key that
// appears twice is a programming error and panics.
func MergeMeta(ms ...map[string]any) map[string]any {
	out := make(map[string]any)
	for _, m := range ms {
		for k := range m {
			if _, dup := out[k]; dup {
				panic("acpmeta: duplicate _meta key " + k)
			}
		}
		maps.Copy(out, m)
	}
	return out
}
