package auditlog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/qmpinput/statedir"
)

// Log appends to the audit log of a state directory. It is safe for
// concurrent use, also across processes. It keeps no file open between
// appends; the caller owns the directory handle.
type Log struct {
	dir *statedir.Dir
	now func() time.Time
}

// New returns the log in dir. now is the clock (nil: time.Now).
func New(dir *statedir.Dir, now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{dir: dir, now: now}
}

// Append sets r's time (if zero), seq and prev, writes it as one line
// under an exclusive lock and fsyncs it. It refuses to append after a
// partial or unparsable last line (ErrChain): the chain is never
// extended past damage. It returns the appended record.
func (l *Log) Append(r Record) (Record, error) {
	if r.Time.IsZero() {
		r.Time = l.now().UTC()
	}
	if err := r.validate(); err != nil {
		return r, err
	}
	f, err := l.dir.OpenFile(FileName, unix.O_RDWR|unix.O_APPEND|unix.O_CREAT)
	if err != nil {
		return r, err
	}
	defer f.Close()
	if err := statedir.Flock(f, true); err != nil {
		return r, err
	}
	defer statedir.Flock(f, false)
	seq, prev, err := tail(f)
	if err != nil {
		return r, err
	}
	r.Seq, r.Prev = seq+1, prev
	line, err := encodeLine(r)
	if err != nil {
		return r, err
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		return r, fmt.Errorf("audit append: %w", err)
	}
	return r, f.Sync()
}

// tail returns the last record's seq and its line's hash (0 and Genesis
// for an empty log).
func tail(f *os.File) (uint64, string, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, "", err
	}
	if st.Size() == 0 {
		return 0, Genesis, nil
	}
	n := min(st.Size(), 2*maxLine)
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, st.Size()-n); err != nil && !errors.Is(err, io.EOF) {
		return 0, "", err
	}
	if buf[len(buf)-1] != '\n' {
		return 0, "", &ChainError{Line: -1, Reason: "the log ends in a partial line"}
	}
	buf = buf[:len(buf)-1]
	last := buf[bytes.LastIndexByte(buf, '\n')+1:]
	r, err := decodeLine(last)
	if err != nil {
		return 0, "", &ChainError{Line: -1, Reason: fmt.Sprintf("last line: %v", err)}
	}
	return r.Seq, Hash(last), nil
}

// Summary is what Verify found.
type Summary struct {
	Entries int            `json:"entries"`
	Head    string         `json:"head"` // hash of the last line (Genesis if empty)
	Kinds   map[string]int `json:"kinds"`
}

// Verify reads the log from r and checks every line: the strict schema
// (no field beyond the closed set, so no content), seq counting up from
// 1, and prev naming the hash of the line before. want, if not nil,
// names earlier heads (line number -> hash) the log must still contain:
// a log rewritten before such a checkpoint fails with ErrCheckpoint.
func Verify(r io.Reader, want map[int]string) (Summary, error) {
	s := Summary{Head: Genesis, Kinds: map[string]int{}}
	br := bufio.NewReaderSize(r, maxLine+1)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, io.EOF) && len(line) == 0 {
			break
		}
		n := s.Entries + 1
		if err != nil {
			return s, &ChainError{Line: n, Reason: fmt.Sprintf("partial or oversize line (%v)", err)}
		}
		line = line[:len(line)-1]
		rec, err := decodeLine(line)
		if err != nil {
			return s, &ChainError{Line: n, Reason: err.Error()}
		}
		if rec.Seq != uint64(n) || rec.Prev != s.Head {
			return s, &ChainError{Line: n, Reason: fmt.Sprintf("seq %d prev %.12s…, want seq %d prev %.12s…", rec.Seq, rec.Prev, n, s.Head)}
		}
		s.Head, s.Entries = Hash(line), n
		s.Kinds[rec.Kind]++
		if h, ok := want[n]; ok && h != s.Head {
			return s, fmt.Errorf("%w: line %d hashes to %s, the checkpoint says %s", ErrCheckpoint, n, s.Head, h)
		}
	}
	for n := range want {
		if n > s.Entries || n < 1 {
			return s, fmt.Errorf("%w: the log has %d lines, the checkpoint names line %d", ErrCheckpoint, s.Entries, n)
		}
	}
	return s, nil
}

// VerifyDir verifies the log in dir (an empty summary if there is none).
func VerifyDir(dir *statedir.Dir, want map[int]string) (Summary, error) {
	f, err := dir.OpenFile(FileName, unix.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		return Verify(bytes.NewReader(nil), want)
	}
	if err != nil {
		return Summary{}, err
	}
	defer f.Close()
	return Verify(f, want)
}

// Read returns every record of the log in dir, verified.
func Read(dir *statedir.Dir) ([]Record, error) {
	f, err := dir.OpenFile(FileName, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	if _, err := Verify(bytes.NewReader(b), nil); err != nil {
		return nil, err
	}
	var out []Record
	for _, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		r, _ := decodeLine(line)
		out = append(out, r)
	}
	return out, nil
}
