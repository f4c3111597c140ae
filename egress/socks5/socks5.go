// Package socks5 is the server side of RFC 1928 that the egress proxy
// needs: the no-authentication method and the CONNECT command, nothing
// else. It only parses and answers; it never resolves or dials, so the
// proxy checks every destination itself. Standard library only.
//
// It is written here, not taken from a library, because the libraries
// that serve SOCKS5 resolve and dial themselves (the proxy must connect
// to the address it checked) and the part kept is about 100 lines.
package socks5

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
)

// Version is the first byte of every SOCKS5 message.
const Version = 5

// Reply codes (RFC 1928, section 6).
const (
	Succeeded           byte = 0
	GeneralFailure      byte = 1
	NotAllowed          byte = 2 // "connection not allowed by ruleset": every refusal
	HostUnreachable     byte = 4
	ConnectionRefused   byte = 5
	CommandNotSupported byte = 7
	AddrNotSupported    byte = 8
)

const (
	methodNoAuth       = 0x00
	methodNoAcceptable = 0xff
	cmdConnect         = 1
	atypIPv4           = 1
	atypDomain         = 3
	atypIPv6           = 4
)

// ErrProtocol is wrapped by every parse failure; Error.Code says what to
// reply, where a reply is still possible.
var ErrProtocol = errors.New("socks5")

// Error is a refused handshake with the reply code to send (0 when the
// client is to be dropped without a reply).
type Error struct {
	Code byte
	Msg  string
}

func (e *Error) Error() string { return "socks5: " + e.Msg }
func (e *Error) Unwrap() error { return ErrProtocol }

// Request is a CONNECT request: Host is a name as sent, or an IPv4 or
// IPv6 literal in its canonical form.
type Request struct {
	Host string
	Port uint16
}

// Handshake reads the client's greeting, chooses no-authentication (or
// refuses when the client does not offer it) and reads the request.
// On an *Error with a Code the caller sends Reply(w, Code).
func Handshake(r io.Reader, w io.Writer) (Request, error) {
	methods, err := ReadGreeting(r)
	if err != nil {
		return Request{}, err
	}
	choice := byte(methodNoAcceptable)
	for _, m := range methods {
		if m == methodNoAuth {
			choice = methodNoAuth
		}
	}
	if _, err := w.Write([]byte{Version, choice}); err != nil {
		return Request{}, err
	}
	if choice != methodNoAuth {
		return Request{}, &Error{Msg: "the client offers no method without authentication"}
	}
	return ReadRequest(r)
}

// ReadGreeting reads VER NMETHODS METHODS.
func ReadGreeting(r io.Reader) ([]byte, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, &Error{Msg: "greeting: " + err.Error()}
	}
	if hdr[0] != Version || hdr[1] == 0 {
		return nil, &Error{Msg: fmt.Sprintf("greeting: version %d with %d methods", hdr[0], hdr[1])}
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return nil, &Error{Msg: "greeting methods: " + err.Error()}
	}
	return methods, nil
}

// ReadRequest reads VER CMD RSV ATYP DST.ADDR DST.PORT.
func ReadRequest(r io.Reader) (Request, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Request{}, &Error{Msg: "request: " + err.Error()}
	}
	if hdr[0] != Version || hdr[2] != 0 {
		return Request{}, &Error{Code: GeneralFailure, Msg: fmt.Sprintf("request: version %d, reserved %d", hdr[0], hdr[2])}
	}
	if hdr[1] != cmdConnect {
		return Request{}, &Error{Code: CommandNotSupported, Msg: fmt.Sprintf("command %d (only CONNECT)", hdr[1])}
	}
	host, err := readAddr(r, hdr[3])
	if err != nil {
		return Request{}, err
	}
	var port [2]byte
	if _, err := io.ReadFull(r, port[:]); err != nil {
		return Request{}, &Error{Msg: "request port: " + err.Error()}
	}
	p := binary.BigEndian.Uint16(port[:])
	if p == 0 {
		return Request{}, &Error{Code: GeneralFailure, Msg: "port 0"}
	}
	return Request{Host: host, Port: p}, nil
}

func readAddr(r io.Reader, atyp byte) (string, error) {
	var n int
	switch atyp {
	case atypIPv4:
		n = 4
	case atypIPv6:
		n = 16
	case atypDomain:
		var l [1]byte
		if _, err := io.ReadFull(r, l[:]); err != nil || l[0] == 0 {
			return "", &Error{Code: GeneralFailure, Msg: "request: empty or missing name"}
		}
		n = int(l[0])
	default:
		return "", &Error{Code: AddrNotSupported, Msg: "address type " + strconv.Itoa(int(atyp))}
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", &Error{Msg: "request address: " + err.Error()}
	}
	switch atyp {
	case atypIPv4:
		return netip.AddrFrom4([4]byte(b)).String(), nil
	case atypIPv6:
		return netip.AddrFrom16([16]byte(b)).String(), nil
	}
	return string(b), nil
}

// Reply writes a reply with code and an unspecified bound address.
func Reply(w io.Writer, code byte) error {
	_, err := w.Write([]byte{Version, code, 0, atypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}
