package tlspeek

import (
	"bytes"
	"errors"
	"testing"
)

// u16 prefixes b with its length in two bytes.
func u16(b []byte) []byte { return append([]byte{byte(len(b) >> 8), byte(len(b))}, b...) }

// sniExt is a server_name extension listing names, each with its type.
func sniExt(names ...any) []byte {
	var list []byte
	for i := 0; i < len(names); i += 2 {
		list = append(append(list, byte(names[i].(int))), u16([]byte(names[i+1].(string)))...)
	}
	return append([]byte{0, 0}, u16(u16(list))...)
}

// craftHello is a minimal ClientHello record carrying exts, written by
// hand so that it can say what crypto/tls's client never would.
func craftHello(exts ...[]byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...)           // random
	body = append(body, 0)                             // session id
	body = append(body, u16([]byte{0x13, 0x01})...)    // TLS_AES_128_GCM_SHA256
	body = append(body, 1, 0)                          // null compression
	body = append(body, u16(bytes.Join(exts, nil))...) // extensions
	msg := append([]byte{1, 0, byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 3, 1}, u16(msg)...)
}

// TestPeekCraftedServerNames: hellos a real client never sends. Two
// host names in one extension, two server_name extensions and a name
// with a trailing dot are not a well-formed ClientHello (crypto/tls
// refuses them), so the proxy refuses the tunnel rather than pick one
// name; upper case is lowered; an entry of another name type is skipped.
// Positive control: the same hand-made hello with one name reads it.
func TestPeekCraftedServerNames(t *testing.T) {
	cases := []struct {
		name string
		raw  []byte
		want string // "" with err: refused
	}{
		{"one name", craftHello(sniExt(0, "allowed.test")), "allowed.test"},
		{"upper case", craftHello(sniExt(0, "ALLOWED.Test")), "allowed.test"},
		{"another type first", craftHello(sniExt(1, "evil.test", 0, "allowed.test")), "allowed.test"},
		{"two names", craftHello(sniExt(0, "allowed.test", 0, "evil.test")), ""},
		{"two extensions", craftHello(sniExt(0, "allowed.test"), sniExt(0, "evil.test")), ""},
		{"trailing dot", craftHello(sniExt(0, "allowed.test.")), ""},
	}
	for _, c := range cases {
		h, read, err := Peek(bytes.NewReader(c.raw))
		if !bytes.Equal(read, c.raw) {
			t.Errorf("%s: read %d of %d bytes", c.name, len(read), len(c.raw))
		}
		switch {
		case c.want == "" && !errors.Is(err, ErrNotHello):
			t.Errorf("%s: %+v, %v; want ErrNotHello", c.name, h, err)
		case c.want != "" && (err != nil || h.ServerName != c.want):
			t.Errorf("%s: %+v, %v; want %q", c.name, h, err, c.want)
		}
	}
}
