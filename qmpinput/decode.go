package qmpinput

import (
	"encoding/json"
	"fmt"

	"github.com/tetherdev/tether/admission/strictjson"
)

// Version is a QEMU version as announced in the QMP greeting.
type Version struct {
	Major, Minor, Micro int
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// Less reports whether v sorts before o.
func (v Version) Less(o Version) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Micro < o.Micro
}

// VersionRange pins the accepted QEMU versions: Min inclusive, Max
// exclusive; a zero Max means no upper bound.
type VersionRange struct {
	Min, Max Version
}

// DefaultVersions accepts QEMU 7.1 and later: PNG screendump arrived in 7.1.
var DefaultVersions = VersionRange{Min: Version{7, 1, 0}}

// Contains reports whether v is in r.
func (r VersionRange) Contains(v Version) bool {
	if v.Less(r.Min) {
		return false
	}
	return r.Max == (Version{}) || v.Less(r.Max)
}

func (r VersionRange) String() string {
	if r.Max == (Version{}) {
		return ">= " + r.Min.String()
	}
	return fmt.Sprintf(">= %s, < %s", r.Min, r.Max)
}

// Greeting is the decoded QMP banner.
type Greeting struct {
	Version      Version
	Package      string
	Capabilities []string
}

type wireGreeting struct {
	QMP *struct {
		Version *struct {
			QEMU *struct {
				Major *int `json:"major"`
				Minor *int `json:"minor"`
				Micro *int `json:"micro"`
			} `json:"qemu"`
			Package string `json:"package"`
		} `json:"version"`
		Capabilities []string `json:"capabilities"`
	} `json:"QMP"`
}

// maxCapabilities bounds the greeting's capability list.
const maxCapabilities = 32

// DecodeGreeting strictly decodes one QMP greeting line: exactly one JSON
// object with the "QMP" member, a complete non-negative version, no unknown
// fields and no trailing data.
func DecodeGreeting(line []byte) (Greeting, error) {
	var w wireGreeting
	if err := strictjson.Decode(line, maxLine, &w); err != nil {
		return Greeting{}, fmt.Errorf("%w: greeting: %w", ErrProtocol, err)
	}
	if w.QMP == nil || w.QMP.Version == nil || w.QMP.Version.QEMU == nil {
		return Greeting{}, fmt.Errorf("%w: greeting: QMP.version.qemu missing", ErrProtocol)
	}
	q := w.QMP.Version.QEMU
	if q.Major == nil || q.Minor == nil || q.Micro == nil || *q.Major < 0 || *q.Minor < 0 || *q.Micro < 0 {
		return Greeting{}, fmt.Errorf("%w: greeting: version incomplete or negative", ErrProtocol)
	}
	if len(w.QMP.Capabilities) > maxCapabilities {
		return Greeting{}, fmt.Errorf("%w: greeting: %d capabilities", ErrProtocol, len(w.QMP.Capabilities))
	}
	return Greeting{
		Version:      Version{*q.Major, *q.Minor, *q.Micro},
		Package:      w.QMP.Version.Package,
		Capabilities: w.QMP.Capabilities,
	}, nil
}

// Message is one decoded QMP line after the greeting: either a reply
// (Return or Error set, with the command's ID) or an asynchronous Event.
type Message struct {
	ID     uint64
	HasID  bool
	Return json.RawMessage
	Error  *QMPError
	Event  string
}

// IsEvent reports whether m is an asynchronous event.
func (m Message) IsEvent() bool { return m.Event != "" }

type wireMessage struct {
	Return    json.RawMessage `json:"return"`
	Error     *wireError      `json:"error"`
	ID        *uint64         `json:"id"`
	Event     *string         `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

type wireError struct {
	Class *string `json:"class"`
	Desc  *string `json:"desc"`
}

// DecodeMessage strictly decodes one QMP line: a reply has exactly one of
// "return" and "error" and no event fields; an event has a non-empty
// "event" and "timestamp" and no reply fields. Unknown fields and trailing
// data are refused. An id must be the unsigned integer the adapter sent.
func DecodeMessage(line []byte) (Message, error) {
	var w wireMessage
	if err := strictjson.Decode(line, maxLine, &w); err != nil {
		return Message{}, fmt.Errorf("%w: message: %w", ErrProtocol, err)
	}
	isReply := w.Return != nil || w.Error != nil
	if w.Event != nil {
		if isReply || w.ID != nil || *w.Event == "" || w.Timestamp == nil {
			return Message{}, fmt.Errorf("%w: message: malformed event", ErrProtocol)
		}
		return Message{Event: *w.Event}, nil
	}
	if w.Data != nil || w.Timestamp != nil {
		return Message{}, fmt.Errorf("%w: message: event fields in a reply", ErrProtocol)
	}
	if w.Return != nil && w.Error != nil || !isReply {
		return Message{}, fmt.Errorf("%w: message: want exactly one of return and error", ErrProtocol)
	}
	m := Message{Return: w.Return}
	if w.ID != nil {
		m.ID, m.HasID = *w.ID, true
	}
	if w.Error != nil {
		if w.Error.Class == nil || w.Error.Desc == nil || *w.Error.Class == "" {
			return Message{}, fmt.Errorf("%w: message: error without class or desc", ErrProtocol)
		}
		m.Error = &QMPError{Class: *w.Error.Class, Desc: *w.Error.Desc}
	}
	return m, nil
}
