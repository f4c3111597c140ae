package custodian

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/longline"
	"github.com/tetherdev/tether/receiver/wire"
)

// A chunked read of a file longer than spoolMin is not assembled in
// memory: its chunks go to a spool file without a name in the state
// directory, hashed, checked for UTF-8 and scanned for the lines asked
// for as they arrive, and a selection longer than spoolMin is answered
// from the file (longline.FileContent), a piece at a time.

// spoolMin is the longest file a chunked read assembles in memory, and
// the longest selection it answers from memory: the most a receipt keeps.
const spoolMin = 1 << 20

// readSpooled reads the cur.Size bytes of args.Path in chunks into a spool
// file and returns the selection: in res.Content when it is short, else in
// fc (res.Content empty), which the caller closes. same is false, and
// nothing is returned, when the bytes are not those of cur.SHA256 (the
// file changed).
func (cl *call) readSpooled(ctx context.Context, conn ReceiverConn, args *wire.ReadArgs, cur *wire.ReadResult) (res *wire.ReadResult, fc *longline.FileContent, same bool, err error) {
	f, err := longline.Spool(cl.c.opts.StateDir)
	if err != nil {
		return nil, nil, false, fmt.Errorf("read %q in chunks: %w", args.Path, err)
	}
	sel := newLineSel(args.Line, args.Limit)
	var text utf8Stream
	sum, err := cl.fetchChunksTo(ctx, conn, args.Path, cur.Size, func(p []byte) error {
		text.Write(p)
		sel.Write(p)
		_, err := f.Write(p)
		return err
	})
	if err != nil || sum != cur.SHA256 {
		f.Close()
		return nil, nil, false, err
	}
	if !text.Valid() {
		f.Close()
		return nil, nil, false, acperr.NewError(errcode.CodeInvalid, "read %q: the file is not valid UTF-8 text", args.Path)
	}
	start, end := sel.Bounds(cur.Size)
	res = &wire.ReadResult{Size: cur.Size, SHA256: cur.SHA256}
	if end-start > spoolMin {
		return res, longline.NewFileContent(f, start, end-start), true, nil
	}
	defer f.Close()
	b := make([]byte, end-start)
	if _, err := f.ReadAt(b, start); err != nil && err != io.EOF {
		return nil, nil, false, fmt.Errorf("read %q back from its spool: %w", args.Path, err)
	}
	res.Content = string(b)
	return res, nil, true, nil
}

// lineSel finds, in a text read a piece at a time, the bytes selectLines
// would select: limit lines (0: to the end) from the 1-based line.
type lineSel struct {
	skip, limit int64 // newlines before the selection; lines in it
	seen, pos   int64 // newlines and bytes seen so far
	start, end  int64
	haveStart   bool
	haveEnd     bool
}

func newLineSel(line, limit int) *lineSel {
	s := &lineSel{skip: int64(max(line-1, 0)), limit: int64(max(limit, 0))}
	s.haveStart = s.skip == 0
	return s
}

// Write scans the next piece of the text.
func (s *lineSel) Write(p []byte) {
	for i := 0; !s.haveEnd && !(s.haveStart && s.limit == 0); {
		j := bytes.IndexByte(p[i:], '\n')
		if j < 0 {
			break
		}
		i += j + 1
		s.seen++
		at := s.pos + int64(i)
		switch {
		case !s.haveStart && s.seen == s.skip:
			s.start, s.haveStart = at, true
		case s.haveStart && s.limit > 0 && s.seen == s.skip+s.limit:
			s.end, s.haveEnd = at, true
		}
	}
	s.pos += int64(len(p))
}

// Bounds returns the selection's offsets in a text of total bytes.
func (s *lineSel) Bounds(total int64) (start, end int64) {
	switch {
	case !s.haveStart:
		return 0, 0
	case s.haveEnd:
		return s.start, s.end
	}
	return s.start, total
}

// utf8Stream checks that a text read a piece at a time is valid UTF-8,
// a character cut between two pieces included.
type utf8Stream struct {
	carry [utf8.UTFMax]byte // the start of a character cut at a piece's end
	n     int
	bad   bool
}

// Write checks the next piece.
func (u *utf8Stream) Write(p []byte) {
	for u.n > 0 && len(p) > 0 && !u.bad {
		u.carry[u.n] = p[0]
		u.n++
		p = p[1:]
		if utf8.FullRune(u.carry[:u.n]) {
			u.bad = !utf8.Valid(u.carry[:u.n])
			u.n = 0
		}
	}
	if u.bad || len(p) == 0 {
		return
	}
	cut := len(p)
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				cut = i
			}
			break
		}
	}
	u.bad = !utf8.Valid(p[:cut])
	u.n = copy(u.carry[:], p[cut:])
}

// Valid reports whether all the text written is valid UTF-8.
func (u *utf8Stream) Valid() bool { return !u.bad && u.n == 0 }
