package socks5

import (
	"bytes"
	"errors"
	"testing"
)

func TestHandshake(t *testing.T) {
	cases := map[string]struct {
		in   []byte
		want Request
		code byte
		fail bool
	}{
		"domain": {in: []byte("\x05\x01\x00\x05\x01\x00\x03\x08pypi.org\x01\xbb"), want: Request{"pypi.org", 443}},
		"ipv4":   {in: []byte("\x05\x02\x02\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50"), want: Request{"127.0.0.1", 80}},
		"ipv6": {in: append([]byte("\x05\x01\x00\x05\x01\x00\x04"), append(make([]byte, 15), 1, 0, 80)...),
			want: Request{"::1", 80}},
		"bind":      {in: []byte("\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50"), code: CommandNotSupported, fail: true},
		"udp":       {in: []byte("\x05\x01\x00\x05\x03\x00\x01\x7f\x00\x00\x01\x00\x50"), code: CommandNotSupported, fail: true},
		"atyp":      {in: []byte("\x05\x01\x00\x05\x01\x00\x09"), code: AddrNotSupported, fail: true},
		"auth only": {in: []byte("\x05\x01\x02"), fail: true},
		"socks4":    {in: []byte("\x04\x01\x00\x50\x7f\x00\x00\x01\x00"), fail: true},
		"truncated": {in: []byte("\x05\x01\x00\x05\x01\x00\x03\x08pypi"), fail: true},
		"port 0":    {in: []byte("\x05\x01\x00\x05\x01\x00\x01\x01\x01\x01\x01\x00\x00"), code: GeneralFailure, fail: true},
	}
	for name, tc := range cases {
		var out bytes.Buffer
		req, err := Handshake(bytes.NewReader(tc.in), &out)
		var e *Error
		switch {
		case tc.fail && (!errors.As(err, &e) || e.Code != tc.code || !errors.Is(err, ErrProtocol)):
			t.Errorf("%s: %v, want an Error with code %d", name, err, tc.code)
		case !tc.fail && (err != nil || req != tc.want):
			t.Errorf("%s: %+v, %v; want %+v", name, req, err, tc.want)
		}
	}
}

// FuzzHandshake: the parser never panics or reads past what it needs,
// and a request it accepts has a host and a port.
func FuzzHandshake(f *testing.F) {
	f.Add([]byte("\x05\x01\x00\x05\x01\x00\x03\x08pypi.org\x01\xbb"))
	f.Add([]byte("\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50"))
	f.Add([]byte("\x05\x01\x00\x05\x01\x00\x04\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := Handshake(bytes.NewReader(b), &bytes.Buffer{})
		if err == nil && (req.Host == "" || req.Port == 0) {
			t.Fatalf("accepted %+v", req)
		}
	})
}
