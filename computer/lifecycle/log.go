package lifecycle

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
	"strconv"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// MaxRecordBytes bounds one line of the log.
const MaxRecordBytes = 16 << 10

// genesis is the prev hash of the first record.
var genesis = string(bytes.Repeat([]byte("0"), 64))

// Sentinels of a record or log that does not check.
var (
	ErrRecord  = errors.New("malformed record")
	ErrSeq     = errors.New("sequence number out of order")
	ErrPrev    = errors.New("prev hash does not match the previous record's hash")
	ErrHash    = errors.New("hash does not match the record")
	ErrTorn    = errors.New("last record is not terminated (torn write)")
	ErrStateOf = errors.New("from is not the computer's last state")
)

// Record is one transition of one computer. Hash is the hex SHA-256 of
// the record's canonical encoding (Canonical), which covers every other
// field, Prev included, so each record seals the whole log before it.
type Record struct {
	Seq      uint64    `json:"seq"`
	Computer string    `json:"computer"`
	Owner    string    `json:"owner"`
	From     string    `json:"from"`
	To       string    `json:"to"`
	At       time.Time `json:"at"`
	Reason   string    `json:"reason,omitempty"`
	Prev     string    `json:"prev"`
	Hash     string    `json:"hash"`
}

// Canonical is the byte string a record's hash covers: a version line,
// then one line per field in a fixed order, each string field as its
// length in bytes, a colon and its bytes, so no two records share one.
// At is in UTC with nanoseconds (RFC 3339).
func (r Record) Canonical() []byte {
	var b bytes.Buffer
	b.WriteString("tether-computer-log v1\n")
	b.WriteString("seq=" + strconv.FormatUint(r.Seq, 10) + "\n")
	for _, f := range [][2]string{{"computer", r.Computer}, {"owner", r.Owner}, {"from", r.From},
		{"to", r.To}, {"at", r.At.UTC().Format(time.RFC3339Nano)}, {"reason", r.Reason}, {"prev", r.Prev}} {
		b.WriteString(f[0] + "=" + strconv.Itoa(len(f[1])) + ":" + f[1] + "\n")
	}
	return b.Bytes()
}

// Sum returns the hex SHA-256 of r's canonical encoding.
func (r Record) Sum() string {
	h := sha256.Sum256(r.Canonical())
	return hex.EncodeToString(h[:])
}

// ParseRecord parses one line of the log (without its newline) strictly
// and checks that its fields are well formed and its hash matches it; it
// does not check the chain (Verify does).
func ParseRecord(line []byte) (Record, error) {
	var r Record
	if err := strictjson.Decode(line, MaxRecordBytes, &r); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrRecord, err)
	}
	if err := r.wellFormed(); err != nil {
		return Record{}, err
	}
	if r.Hash != r.Sum() {
		return Record{}, ErrHash
	}
	return r, nil
}

// wellFormed checks each field on its own.
func (r Record) wellFormed() error {
	switch {
	case r.Seq == 0:
		return fmt.Errorf("%w: seq 0", ErrRecord)
	case r.Computer == "":
		return fmt.Errorf("%w: no computer", ErrRecord)
	case r.From != None && !Known(r.From), !Known(r.To):
		return fmt.Errorf("%w: unknown state", ErrRecord)
	case r.At.IsZero():
		return fmt.Errorf("%w: no time", ErrRecord)
	case !isHex64(r.Prev) || !isHex64(r.Hash):
		return fmt.Errorf("%w: prev and hash must be 64 lower-case hex digits", ErrRecord)
	}
	return nil
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// BrokenError names the first record of a log that does not check: its
// line (1-based) and the failed check.
type BrokenError struct {
	Line int
	Err  error
}

func (e *BrokenError) Error() string {
	return fmt.Sprintf("lifecycle log: record on line %d: %v", e.Line, e.Err)
}

func (e *BrokenError) Unwrap() error { return e.Err }

// chain is the state Verify and Open carry from record to record.
type chain struct {
	seq   uint64
	hash  string
	state map[string]string // computer → last state
}

func newChain() *chain { return &chain{hash: genesis, state: map[string]string{}} }

// next checks that r follows the chain: its seq is the next, its prev is
// the last hash, and its transition is legal from the computer's last
// state. It then advances the chain.
func (c *chain) next(r Record) error {
	if r.Seq != c.seq+1 {
		return fmt.Errorf("%w: seq %d after %d", ErrSeq, r.Seq, c.seq)
	}
	if r.Prev != c.hash {
		return ErrPrev
	}
	if last := c.state[r.Computer]; r.From != last {
		return fmt.Errorf("%w: %s was %q, record says %q", ErrStateOf, r.Computer, last, r.From)
	}
	if err := Check(r.From, r.To); err != nil {
		return err
	}
	c.seq, c.hash, c.state[r.Computer] = r.Seq, r.Hash, r.To
	return nil
}

// Verify reads the log at path and checks every record: its shape, its
// hash, its place in the chain, and that its transition is legal. It
// returns the number of records that check (all of them when the error
// is nil), and a *BrokenError naming the first record that fails.
func Verify(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("lifecycle log: %w", err)
	}
	defer f.Close()
	c, _, err := scan(f)
	if c == nil {
		return 0, err
	}
	return int(c.seq), err
}

// scan reads records from r through the chain. It returns the chain as
// far as it checked, the offset just after the last good record, and the
// first error (a *BrokenError), if any.
func scan(r io.Reader) (*chain, int64, error) {
	c := newChain()
	br := bufio.NewReaderSize(r, MaxRecordBytes+1)
	var off int64
	for line := 1; ; line++ {
		b, err := br.ReadSlice('\n')
		if err == io.EOF && len(b) == 0 {
			return c, off, nil
		}
		if err == io.EOF {
			return c, off, &BrokenError{Line: line, Err: ErrTorn}
		}
		if err != nil {
			return c, off, &BrokenError{Line: line, Err: fmt.Errorf("%w: %w", ErrRecord, err)}
		}
		rec, err := ParseRecord(b[:len(b)-1])
		if err == nil {
			err = c.next(rec)
		}
		if err != nil {
			return c, off, &BrokenError{Line: line, Err: err}
		}
		off += int64(len(b))
	}
}

// Log appends records to one file. Its methods are safe for concurrent
// use. The caller closes it.
type Log struct {
	mu    sync.Mutex
	f     *os.File
	chain *chain
	// Repaired says Open cut a torn last record (a write a crash
	// interrupted before its fsync returned, so no one was told of it).
	Repaired bool
}

// Open opens (or creates) the log at path for appending. It verifies the
// whole log first and refuses one that does not verify, except for a torn
// last line, which it cuts (see Repaired).
func Open(path string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lifecycle log: %w", err)
	}
	l, err := openFile(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

func openFile(f *os.File) (*Log, error) {
	c, off, err := scan(f)
	repaired := false
	if be := (*BrokenError)(nil); errors.As(err, &be) && errors.Is(err, ErrTorn) {
		if err := f.Truncate(off); err != nil {
			return nil, fmt.Errorf("lifecycle log: cut torn record: %w", err)
		}
		repaired, err = true, nil
	}
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, fmt.Errorf("lifecycle log: %w", err)
	}
	return &Log{f: f, chain: c, Repaired: repaired}, nil
}

// Append checks r's transition against the computer's last state in the
// log, fills in Seq, Prev and Hash, writes the record as one line and
// fsyncs the file before it returns the record as written.
func (l *Log) Append(r Record) (Record, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return Record{}, errors.New("lifecycle log: closed")
	}
	r.Seq, r.Prev, r.At = l.chain.seq+1, l.chain.hash, r.At.Round(0).UTC()
	r.Hash = r.Sum()
	if err := r.wellFormed(); err != nil {
		return Record{}, err
	}
	if err := l.chain.check(r); err != nil {
		return Record{}, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return Record{}, fmt.Errorf("lifecycle log: %w", err)
	}
	if _, err := l.f.Write(append(b, '\n')); err != nil {
		return Record{}, fmt.Errorf("lifecycle log: write: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return Record{}, fmt.Errorf("lifecycle log: fsync: %w", err)
	}
	l.chain.advance(r)
	return r, nil
}

// check is next without advancing.
func (c *chain) check(r Record) error {
	cp := chain{seq: c.seq, hash: c.hash, state: map[string]string{r.Computer: c.state[r.Computer]}}
	return cp.next(r)
}

func (c *chain) advance(r Record) { c.seq, c.hash, c.state[r.Computer] = r.Seq, r.Hash, r.To }

// Last returns the last state the log holds for a computer (None if it
// has no record).
func (l *Log) Last(computer string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.chain.state[computer]
}

// Close closes the file; safe to call twice.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
