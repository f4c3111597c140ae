// Package egresslog is the egress proxy's hash-chained connection log:
// one JSON record per line, one line per connection, each carrying the
// SHA-256 of the line before it. Verify finds any edit, deletion,
// insertion or reordering of the lines it reads; a truncation of the
// tail shows only against a head (record count and hash) kept elsewhere,
// which VerifyHead checks.
package egresslog

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// MaxLine bounds one record's line.
const MaxLine = 16 << 10

// Genesis is the Prev of the first record.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// Verdicts.
const (
	Allowed = "allowed"
	Refused = "refused"
	Failed  = "failed" // allowed, but the destination could not be reached
)

// Record is one connection.
type Record struct {
	Seq      uint64    `json:"seq"`
	Time     time.Time `json:"time"` // when the connection was accepted
	Computer string    `json:"computer"`
	Proto    string    `json:"proto"`          // http, connect or socks5
	Host     string    `json:"host,omitempty"` // the name or literal asked for
	Port     uint16    `json:"port,omitempty"`
	Addr     string    `json:"addr,omitempty"` // the checked address connected to
	Rule     string    `json:"rule,omitempty"` // the rule that decided
	Verdict  string    `json:"verdict"`
	Check    string    `json:"check,omitempty"` // for a refusal: policy.Check*
	Reason   string    `json:"reason,omitempty"`
	Up       int64     `json:"bytes_up"`   // computer to destination
	Down     int64     `json:"bytes_down"` // destination to computer
	Micros   int64     `json:"duration_us"`
	Prev     string    `json:"prev"` // hex SHA-256 of the previous line, without its newline
}

// Head is the chain's end: how many records, and the hash of the last
// line (Genesis for an empty log).
type Head struct {
	Records uint64
	Hash    string
}

// ErrBroken is wrapped by every Verify failure.
var ErrBroken = errors.New("egress log does not verify")

// ErrTooLong is returned by Append for a record whose line would be
// longer than MaxLine: it is not written, since Verify (and so Open)
// would refuse the log from that line on.
var ErrTooLong = errors.New("egress log: record longer than MaxLine")

// Log appends records to one file. Safe for concurrent use.
type Log struct {
	mu   sync.Mutex
	f    *os.File
	head Head
}

// Open verifies the log at path (creating it, mode 0600, if missing) and
// continues its chain. It fails on a log that does not verify: the
// operator moves it aside. The caller closes the Log.
func Open(path string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("egress log: %w", err)
	}
	head, err := VerifyReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("egress log %s: %w", path, err)
	}
	return &Log{f: f, head: head}, nil
}

// Append sets r's Seq and Prev, writes it as one line, and returns the
// record as written.
func (l *Log) Append(r Record) (Record, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return r, errors.New("egress log closed")
	}
	r.Seq, r.Prev = l.head.Records, l.head.Hash
	r = validUTF8(r)
	line, err := json.Marshal(r)
	if err != nil {
		return r, fmt.Errorf("egress log: %w", err)
	}
	if len(line) >= MaxLine {
		return r, fmt.Errorf("%w: %d bytes", ErrTooLong, len(line))
	}
	if _, err := l.f.Write(append(line, '\n')); err != nil {
		return r, fmt.Errorf("egress log: %w", err)
	}
	l.head = Head{Records: r.Seq + 1, Hash: lineHash(line)}
	return r, nil
}

// validUTF8 replaces every invalid UTF-8 byte of r's strings with
// U+FFFD. json.Marshal would write such a byte as the escape \ufffd, which
// decodes to a rune that marshals unescaped: the line would not be in
// canonical form and Verify would refuse it. A host is what a client
// sent (a SOCKS5 name is any bytes), so Append must not trust it.
func validUTF8(r Record) Record {
	for _, f := range []*string{&r.Computer, &r.Proto, &r.Host, &r.Addr, &r.Rule, &r.Verdict, &r.Check, &r.Reason} {
		*f = strings.ToValidUTF8(*f, "\uFFFD")
	}
	return r
}

// Head returns the chain's current end.
func (l *Log) Head() Head {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head
}

// Close syncs and closes the file; safe twice.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := errors.Join(l.f.Sync(), l.f.Close())
	l.f = nil
	return err
}

func lineHash(line []byte) string {
	sum := sha256.Sum256(line)
	return hex.EncodeToString(sum[:])
}

// Verify reads the log at path and checks its chain.
func Verify(path string) (Head, error) {
	f, err := os.Open(path)
	if err != nil {
		return Head{}, err
	}
	defer f.Close()
	return VerifyReader(f)
}

// VerifyHead is Verify, and also checks the log against a head kept
// elsewhere (Proxy.LogHead, or what an earlier Verify printed): the log
// must hold want's record count, its line at that point must hash to
// want's hash, and it may have grown since. So a truncation of the tail
// (down to a whole line) and an edit or replacement of the last lines,
// which Verify alone cannot see, fail with ErrBroken.
func VerifyHead(path string, want Head) (Head, error) {
	f, err := os.Open(path)
	if err != nil {
		return Head{}, err
	}
	defer f.Close()
	seen := want.Records == 0 && want.Hash == Genesis
	head, err := verify(f, func(h Head) {
		if h.Records == want.Records {
			seen = h.Hash == want.Hash
		}
	})
	switch {
	case err != nil:
		return head, err
	case head.Records < want.Records:
		return head, fmt.Errorf("%w: %d records, the kept head says %d (the tail was cut)", ErrBroken, head.Records, want.Records)
	case !seen:
		return head, fmt.Errorf("%w: record %d does not hash to the kept head %.16s… (the log was edited or replaced)",
			ErrBroken, want.Records-1, want.Hash)
	}
	return head, nil
}

// VerifyReader checks a log: every line a strict, canonical Record whose
// Seq counts from 0 and whose Prev is the hash of the line before.
func VerifyReader(r io.Reader) (Head, error) { return verify(r, func(Head) {}) }

// verify is VerifyReader, calling each with the head after every line.
func verify(r io.Reader, each func(Head)) (Head, error) {
	br := bufio.NewReaderSize(r, MaxLine+1)
	head := Head{Hash: Genesis}
	for {
		line, err := br.ReadSlice('\n')
		if err == io.EOF && len(line) == 0 {
			return head, nil
		}
		if err != nil {
			return head, fmt.Errorf("%w: record %d: torn or longer than %d bytes: %v", ErrBroken, head.Records, MaxLine, err)
		}
		if err := checkLine(line[:len(line)-1], head); err != nil {
			return head, fmt.Errorf("%w: record %d: %w", ErrBroken, head.Records, err)
		}
		head = Head{Records: head.Records + 1, Hash: lineHash(line[:len(line)-1])}
		each(head)
	}
}

func checkLine(line []byte, head Head) error {
	var rec Record
	if err := strictjson.Decode(line, MaxLine, &rec); err != nil {
		return err
	}
	if rec.Seq != head.Records {
		return fmt.Errorf("seq %d, want %d (a record was removed, added or moved)", rec.Seq, head.Records)
	}
	if rec.Prev != head.Hash {
		return fmt.Errorf("prev %.16s…, want %.16s… (the record before was changed, removed or moved)", rec.Prev, head.Hash)
	}
	again, err := json.Marshal(rec)
	if err != nil || !bytes.Equal(again, line) {
		return errors.New("not in canonical form (edited by hand?)")
	}
	return nil
}
