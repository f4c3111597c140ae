package server

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/strictjson"
)

// ticket is what a plan's ticket says: the call was authorized on Conn
// for the binding of Session at Epoch, and its reports are accepted until
// Expires (Unix ms). The host echoes it in Report; it cannot forge or
// alter one (HMAC-SHA256 under a key that never leaves the plugin
// process), so a report can fence or check only a binding the plugin
// authorized a call for, on the connection it authorized it on.
type ticket struct {
	Conn    string `json:"c"`
	Session string `json:"s"`
	Epoch   uint64 `json:"e"`
	Expires int64  `json:"x"`
}

// ticketer mints and opens tickets. Tickets are stateless: nothing is kept
// per call, so a call that never reports costs nothing.
type ticketer struct {
	key [32]byte
	now func() time.Time
}

func newTicketer(now func() time.Time) *ticketer {
	t := &ticketer{now: now}
	if _, err := rand.Read(t.key[:]); err != nil {
		panic(fmt.Sprintf("impl: ticket key: %v", err)) // crypto/rand never fails on Linux
	}
	return t
}

var b64 = base64.RawURLEncoding

// maxTicketBytes bounds a ticket's JSON: two IDs and two numbers.
const maxTicketBytes = 4 << 10

func (t *ticketer) mac(payload []byte) []byte {
	m := hmac.New(sha256.New, t.key[:])
	m.Write(payload)
	return m.Sum(nil)
}

// mint returns the ticket's text: base64url(JSON) "." base64url(MAC).
func (t *ticketer) mint(tk ticket) string {
	payload, err := json.Marshal(tk)
	if err != nil {
		panic(fmt.Sprintf("impl: marshal ticket: %v", err)) // strings and integers only
	}
	return b64.EncodeToString(payload) + "." + b64.EncodeToString(t.mac(payload))
}

// open verifies a ticket presented on connID and returns what it says.
// A ticket that is malformed, altered, or minted for another connection
// is refused (invalid).
func (t *ticketer) open(connID, s string) (ticket, error) {
	enc, sig, ok := strings.Cut(s, ".")
	payload, perr := b64.DecodeString(enc)
	mac, merr := b64.DecodeString(sig)
	if !ok || perr != nil || merr != nil || !hmac.Equal(mac, t.mac(payload)) {
		return ticket{}, errcode.Errorf(errcode.CodeInvalid, "report: the ticket is not one this plugin issued")
	}
	var tk ticket
	if err := strictjson.Decode(payload, maxTicketBytes, &tk); err != nil {
		return ticket{}, errcode.Errorf(errcode.CodeInvalid, "report: ticket: %v", err)
	}
	if tk.Conn != connID {
		return ticket{}, errcode.Errorf(errcode.CodeInvalid, "report: the ticket was issued on another connection")
	}
	return tk, nil
}

// expired reports whether the ticket's call is over.
func (t *ticketer) expired(tk ticket) bool { return t.now().UnixMilli() > tk.Expires }
