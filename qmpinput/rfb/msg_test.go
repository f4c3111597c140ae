package rfb

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

var pf32 = []byte{32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}

func TestReadClientMessageAccepts(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []byte
		want Msg
	}{
		{"set pixel format", append([]byte{0, 0, 0, 0}, pf32...), SetPixelFormat{Format: rawFormat}},
		{"set encodings", []byte{2, 0, 0, 2, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0x21}, SetEncodings{Encodings: []int32{7, -223}}},
		{"update request", []byte{3, 1, 0, 1, 0, 2, 0, 3, 0, 4}, UpdateRequest{Incremental: true, X: 1, Y: 2, W: 3, H: 4}},
		{"key down", []byte{4, 1, 0, 0, 0, 0, 0, 0x61}, KeyEvent{Down: true, Keysym: 0x61}},
		{"pointer", []byte{5, 3, 1, 0, 0, 9}, PointerEvent{Mask: 3, X: 256, Y: 9}},
		{"cut text", []byte{6, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'}, CutText{Length: 3}},
		{"extended clipboard cut text", []byte{6, 0, 0, 0, 0xff, 0xff, 0xff, 0xfe, 1, 2}, CutText{Length: 2}},
		{"qemu extended key", []byte{255, 0, 0, 1, 0, 0, 0, 0x61, 0, 0, 0, 0x1e}, ExtKeyEvent{Down: true, Keysym: 0x61, Keycode: 0x1e}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := bytes.NewReader(c.in)
			m, err := ReadClientMessage(r)
			if err != nil || !reflect.DeepEqual(m, c.want) {
				t.Fatalf("got %#v, %v; want %#v", m, err, c.want)
			}
			if r.Len() != 0 {
				t.Fatalf("%d bytes left unread", r.Len())
			}
			if _, ok := m.(CutText); !ok && !bytes.Equal(m.Encode(), c.in) {
				t.Fatalf("encode %v, want the original %v", m.Encode(), c.in)
			}
		})
	}
}

func TestReadClientMessageRefuses(t *testing.T) {
	bigCut := []byte{6, 0, 0, 0, 0, 0x10, 0, 1} // 1 MiB + 1
	for _, c := range []struct {
		name string
		in   []byte
		typ  int
	}{
		{"unknown type", []byte{7}, 7},
		{"fence", []byte{248, 0, 0, 0, 0, 0, 0, 0, 0}, 248},
		{"set desktop size", []byte{251, 0, 0, 0, 0, 0, 1, 0}, 251},
		{"xvp", []byte{250, 0, 1, 2}, 250},
		{"continuous updates", []byte{150, 1, 0, 0, 0, 0, 0, 0, 0, 0}, 150},
		{"qemu audio", []byte{255, 1, 0, 0}, 255},
		{"truncated key", []byte{4, 1, 0}, 4},
		{"key flag 2", []byte{4, 2, 0, 0, 0, 0, 0, 0x61}, 4},
		{"ext key flag 2", []byte{255, 0, 0, 2, 0, 0, 0, 0x61, 0, 0, 0, 0x1e}, 255},
		{"incremental flag 9", []byte{3, 9, 0, 1, 0, 2, 0, 3, 0, 4}, 3},
		{"bpp 24", append([]byte{0, 0, 0, 0, 24, 24, 0, 1}, pf32[4:]...), 0},
		{"depth above bpp", append([]byte{0, 0, 0, 0, 16, 24, 0, 1}, pf32[4:]...), 0},
		{"true colour flag 7", append([]byte{0, 0, 0, 0, 32, 24, 0, 7}, pf32[4:]...), 0},
		{"too many encodings", []byte{2, 0, 0x01, 0x00}, 2},
		{"encodings truncated", []byte{2, 0, 0, 2, 0, 0, 0, 7}, 2},
		{"cut text too long", bigCut, 6},
		{"cut text truncated", []byte{6, 0, 0, 0, 0, 0, 0, 5, 'a'}, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadClientMessage(bytes.NewReader(c.in))
			var me *MalformedError
			if !errors.As(err, &me) || !errors.Is(err, ErrMalformed) || me.Type != c.typ {
				t.Fatalf("got %v, want a MalformedError of type %d", err, c.typ)
			}
		})
	}
	if _, err := ReadClientMessage(bytes.NewReader(nil)); !errors.Is(err, io.EOF) {
		t.Fatalf("empty stream: %v, want io.EOF (a clean close)", err)
	}
}

func TestFilterEncodings(t *testing.T) {
	// What noVNC 1.7 sends for a 24-bit screen, in its order.
	novnc := []int32{1, 7, -260, 16, 21, 5, 2, 6, 0, -26, -254, -223, -224, -258, -261, -308, -309, -312, -313, -307,
		int32(-0x3f5e1a32), -316, 0x574d5664, -239}
	got, removed := FilterEncodings(SetEncodings{Encodings: novnc})
	want := []int32{1, 7, -260, 16, 5, 2, 6, 0, -26, -254, -223, -224, -258, -261, -307, 0x574d5664, -239}
	if !reflect.DeepEqual(got.Encodings, want) || removed != len(novnc)-len(want) {
		t.Fatalf("filtered %v (removed %d), want %v", got.Encodings, removed, want)
	}
	for _, e := range []int32{-309, -312, -313, -308, -316, int32(-0x3f5e1a32), -259, -257, 50, 21} {
		if AllowedEncoding(e) {
			t.Errorf("encoding %d is allowed", e)
		}
	}
}
