// Package tlspeek reads the start of a tunnelled stream to learn what it
// carries: a TLS ClientHello and its server name (SNI), or something
// else. It hands back every byte it read, so the caller replays them
// upstream unchanged. The ClientHello is parsed by crypto/tls itself, so
// there is no second TLS parser here to get wrong.
package tlspeek

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// recordTypeHandshake is the first byte of a TLS handshake record.
const recordTypeHandshake = 0x16

// ErrNotHello is wrapped when the stream starts as TLS but holds no
// well-formed ClientHello.
var ErrNotHello = errors.New("tls: no well-formed ClientHello")

// Hello is what the stream's start shows.
type Hello struct {
	TLS        bool   // the stream starts with a TLS handshake record
	ServerName string // the SNI, lower case without a trailing dot; empty if none
}

var errSeen = errors.New("tlspeek: ClientHello seen")

// Peek reads from r (the caller sets its deadline) until it has the
// first byte and, for TLS, the whole ClientHello. It returns the bytes
// read, also on error.
func Peek(r io.Reader) (Hello, []byte, error) {
	var first [1]byte
	if _, err := io.ReadFull(r, first[:]); err != nil {
		return Hello{}, nil, err
	}
	if first[0] != recordTypeHandshake {
		return Hello{}, first[:], nil
	}
	var read bytes.Buffer
	read.WriteByte(first[0])
	in := io.MultiReader(bytes.NewReader(first[:]), io.TeeReader(r, &read))
	var hello Hello
	cfg := &tls.Config{GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		hello = Hello{TLS: true, ServerName: strings.TrimSuffix(strings.ToLower(chi.ServerName), ".")}
		return nil, errSeen
	}}
	err := tls.Server(&readOnly{r: in}, cfg).Handshake()
	if hello.TLS {
		return hello, read.Bytes(), nil
	}
	return Hello{TLS: true}, read.Bytes(), fmt.Errorf("%w: %v", ErrNotHello, err)
}

// readOnly is the net.Conn crypto/tls reads the hello from; what the
// TLS server would write (an alert) is dropped.
type readOnly struct{ r io.Reader }

func (c *readOnly) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *readOnly) Write(p []byte) (int, error)      { return len(p), nil }
func (c *readOnly) Close() error                     { return nil }
func (c *readOnly) LocalAddr() net.Addr              { return nil }
func (c *readOnly) RemoteAddr() net.Addr             { return nil }
func (c *readOnly) SetDeadline(time.Time) error      { return nil }
func (c *readOnly) SetReadDeadline(time.Time) error  { return nil }
func (c *readOnly) SetWriteDeadline(time.Time) error { return nil }
