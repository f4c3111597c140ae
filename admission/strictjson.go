package admission

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrStrictJSON is wrapped by every refusal of decodeStrict.
var ErrStrictJSON = errors.New("strict json")

// errTooDeep is wrapped (with ErrStrictJSON) by a document nested deeper
// than maxJSONDepth, so tests can tell the depth check from the others.
var errTooDeep = fmt.Errorf("nested deeper than %d", maxJSONDepth)

// maxJSONDepth bounds nesting; the deepest admission document nests four
// levels (snapshot, grants, grant, tuple).
const maxJSONDepth = 16

// decodeStrict decodes exactly one JSON object into v. Beyond
// DisallowUnknownFields it refuses what encoding/json would quietly accept:
// duplicate keys (last one wins), keys that only match a field
// case-insensitively, nesting deeper than maxJSONDepth, and trailing data.
// Every key in tether's admission documents is lowercase snake_case.
func decodeStrict(data []byte, v any) error {
	if err := checkKeys(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrStrictJSON, err)
	}
	if len(bytes.TrimSpace(data[dec.InputOffset():])) != 0 {
		return fmt.Errorf("%w: trailing data after the value", ErrStrictJSON)
	}
	return nil
}

// checkKeys walks the tokens of the first JSON value in data and refuses
// duplicate or non-snake_case object keys and excessive depth.
func checkKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStrictJSON, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("%w: top level is not an object", ErrStrictJSON)
	}
	return walkObject(dec, 1)
}

// walkObject consumes an object whose '{' has been read.
func walkObject(dec *json.Decoder, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("%w: %w", ErrStrictJSON, errTooDeep)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrStrictJSON, err)
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("%w: object key is not a string", ErrStrictJSON)
		}
		if !snakeCase(key) {
			return fmt.Errorf("%w: key %q is not lowercase snake_case", ErrStrictJSON, key)
		}
		if seen[key] {
			return fmt.Errorf("%w: duplicate key %q", ErrStrictJSON, key)
		}
		seen[key] = true
		if err := walkValue(dec, depth); err != nil {
			return err
		}
	}
	_, err := dec.Token() // '}'
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStrictJSON, err)
	}
	return nil
}

// walkValue consumes one value at depth.
func walkValue(dec *json.Decoder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%w: %w", ErrStrictJSON, err)
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch d {
	case '{':
		return walkObject(dec, depth+1)
	case '[':
		if depth+1 > maxJSONDepth {
			return fmt.Errorf("%w: %w", ErrStrictJSON, errTooDeep)
		}
		for dec.More() {
			if err := walkValue(dec, depth+1); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // ']'
			return fmt.Errorf("%w: %w", ErrStrictJSON, err)
		}
	}
	return nil
}

func snakeCase(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// DecodeStrictJSON decodes one JSON object into v with the rules of every
// admission document: unknown, duplicate or non-snake_case keys, deep
// nesting and trailing data are refused (errors wrap ErrStrictJSON). Other
// tether configuration files use it too.
func DecodeStrictJSON(data []byte, v any) error { return decodeStrict(data, v) }
