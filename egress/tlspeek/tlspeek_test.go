package tlspeek

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
)

// clientHello returns the first flight a real TLS client sends for sni.
func clientHello(t testing.TB, sni string) []byte {
	t.Helper()
	c, s := net.Pipe()
	go func() {
		tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: sni == ""}).Handshake()
	}()
	buf := make([]byte, 16<<10)
	var got []byte
	for {
		n, err := s.Read(buf)
		got = append(got, buf[:n]...)
		if h, _, perr := Peek(bytes.NewReader(got)); perr == nil && h.TLS {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	c.Close()
	return got
}

func TestPeekReadsTheServerName(t *testing.T) {
	for _, sni := range []string{"pypi.org", "Files.PyPI.org", ""} {
		raw := clientHello(t, sni)
		h, read, err := Peek(bytes.NewReader(raw))
		want := map[string]string{"pypi.org": "pypi.org", "Files.PyPI.org": "files.pypi.org", "": ""}[sni]
		if err != nil || !h.TLS || h.ServerName != want {
			t.Errorf("Peek(hello for %q) = %+v, %v; want %q", sni, h, err, want)
		}
		if !bytes.Equal(read, raw[:len(read)]) || len(read) == 0 {
			t.Errorf("Peek returned bytes that are not the stream's start")
		}
	}
	h, read, err := Peek(bytes.NewReader([]byte("SSH-2.0-x\r\n")))
	if err != nil || h.TLS || string(read) != "S" {
		t.Errorf("Peek(ssh) = %+v, %q, %v", h, read, err)
	}
	_, _, err = Peek(bytes.NewReader([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0}))
	if !errors.Is(err, ErrNotHello) {
		t.Errorf("Peek(garbage hello) = %v", err)
	}
	if _, _, err := Peek(bytes.NewReader(nil)); err != io.EOF {
		t.Errorf("Peek(empty) = %v", err)
	}
}

// FuzzPeek: Peek never panics and only hands back bytes of the stream.
func FuzzPeek(f *testing.F) {
	f.Add(clientHello(f, "pypi.org"))
	f.Add([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0})
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, read, _ := Peek(bytes.NewReader(b))
		if !bytes.HasPrefix(b, read) {
			t.Fatalf("read %x is not a prefix of the input", read)
		}
	})
}
