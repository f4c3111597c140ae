package rfb

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

// FuzzReadClientMessage: the parser never panics, reads only what it
// accepts, and what it accepts re-encodes to a message that parses back
// to the same value (so the forwarded bytes mean what was checked).
func FuzzReadClientMessage(f *testing.F) {
	f.Add(append([]byte{0, 0, 0, 0}, pf32...))
	f.Add([]byte{2, 0, 0, 2, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0x21})
	f.Add([]byte{3, 1, 0, 1, 0, 2, 0, 3, 0, 4})
	f.Add([]byte{4, 1, 0, 0, 0, 0, 0, 0x61})
	f.Add([]byte{5, 3, 1, 0, 0, 9})
	f.Add([]byte{6, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{255, 0, 0, 1, 0, 0, 0, 0x61, 0, 0, 0, 0x1e})
	f.Add([]byte{255, 1, 0, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		m, err := ReadClientMessage(r)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, io.EOF) {
				t.Fatalf("error %v is neither malformed nor a clean EOF", err)
			}
			return
		}
		used := len(in) - r.Len()
		if _, ok := m.(CutText); ok {
			return
		}
		enc := m.Encode()
		if !bytes.Equal(enc, in[:used]) && !isPadded(m) {
			t.Fatalf("%#v encodes to %x, read from %x", m, enc, in[:used])
		}
		back, err := ReadClientMessage(bytes.NewReader(enc))
		if err != nil || !reflect.DeepEqual(back, m) {
			t.Fatalf("re-encoded %#v parses to %#v, %v", m, back, err)
		}
	})
}

// isPadded: messages whose padding bytes are ignored on input and zero
// on output may differ from their input in those bytes only.
func isPadded(m Msg) bool {
	switch m.(type) {
	case SetPixelFormat, SetEncodings, KeyEvent, ExtKeyEvent:
		return true
	}
	return false
}
