package longline

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
)

// The custodian's memory for long agent lines (bigline.go) is bounded
// across every connection it serves (one Caps): at most LongLines such
// lines at once, and at most LongLineBytes charged across them. A long
// line is never held in memory while it is read: its bytes go to a spool
// file without a name in the state directory, and only a whole line that
// gets its charge (twice its length: its bytes, then the content decoded
// from them) is read back and served. A line that cannot get a slot or
// its charge is answered busy; a line longer than its bound (half of
// LongLineBytes, at most maxAgentLine) is answered too_large as soon as
// it passes it. Either way its remaining bytes are read and dropped, only
// scanned for the request's id (idScanner), and the agent's other traffic
// flows on.

// Defaults of the long-line caps.
const (
	DefaultLines = 4
	DefaultBytes = 256 << 20
)

// lineCharge is how many times its length a served long line is charged:
// its bytes and the content decoded from them are alive together.
const lineCharge = 2

// Caps counts the long lines of one Custodian and the bytes charged
// to them.
type Caps struct {
	dir     string // where spool files are made
	perLine int64  // the longest line served

	mu    sync.Mutex
	slots int   // free slots
	bytes int64 // free bytes
	total int64 // LongLineBytes
}

// NewCaps returns caps of lines long lines at once and bytes charged
// across them, spooled in dir, or nil (no caps) when lines is negative.
// One Caps is shared by every Reader of a custodian.
func NewCaps(dir string, lines int, bytes int64) *Caps {
	if lines < 0 {
		return nil
	}
	return &Caps{dir: dir, perLine: min(maxAgentLine, bytes/lineCharge),
		slots: lines, bytes: bytes, total: bytes}
}

// takeSlot takes a slot for one long line, if one is free.
func (lc *Caps) takeSlot() bool {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.slots == 0 {
		return false
	}
	lc.slots--
	return true
}

// charge takes n bytes of the budget, if they are free.
func (lc *Caps) charge(n int64) bool {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if n > lc.bytes {
		return false
	}
	lc.bytes -= n
	return true
}

// release gives back a slot and n charged bytes.
func (lc *Caps) release(n int64) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.slots++
	lc.bytes += n
}

// spool makes a file without a name in dir (O_TMPFILE; where the file
// system has none, a temporary file removed at once). The caller closes
// it; its blocks are freed then.
func spool(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), "long line spool"), nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EISDIR) {
		return nil, fmt.Errorf("spool a long line in %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".longline-*")
	if err != nil {
		return nil, fmt.Errorf("spool a long line: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("spool a long line: unlink: %w", err)
	}
	return f, nil
}

// lineRefusal is why a long line is not served.
type lineRefusal struct {
	code errcode.Code
	why  string
}

// spoolLong reads the long line begun by head into a spool file and
// serves it under the caps, or answers it busy or too_large. It returns
// the error that ends the agent's output, if any.
func (ll *Reader) spoolLong(head [][]byte) error {
	lc := ll.caps
	var sc idScanner
	for _, p := range head {
		sc.Write(p)
	}
	if !lc.takeSlot() {
		return ll.refuseLong(&sc, lineRefusal{errcode.CodeBusy, "the custodian serves as many long messages as it may; retry"})
	}
	f, err := spool(lc.dir)
	if err != nil {
		lc.release(0)
		ll.log.Error("custodian: long agent message", "err", err)
		return ll.refuseLong(&sc, lineRefusal{errcode.CodeBusy, "the custodian could not take a long message; retry"})
	}
	n, refusal, err := ll.fill(f, &sc, head)
	switch {
	case err != nil || refusal != nil:
	case n > lc.perLine: // the head alone, under a bound below the SDK's
		refusal = ll.tooLarge()
	case !lc.charge(lineCharge * n):
		refusal = &lineRefusal{errcode.CodeBusy, "the custodian holds as many long-message bytes as it may; retry"}
	}
	if refusal != nil || err != nil {
		f.Close()
		lc.release(0)
		if refusal == nil {
			return err // the agent's output ended inside the line: no answer
		}
		return ll.refuseLong(&sc, *refusal)
	}
	ll.calls.Go(func() {
		defer lc.release(lineCharge * n)
		ll.serveSpooled(f, n, &sc)
	})
	return nil
}

// serveSpooled decodes the n-byte line in f from a read-only mapping of
// f and serves it. It closes f. A write's content stays in the mapping
// and is decoded from it as it is sent (Content), so the mapping lives
// until the write is answered; any other request is unmapped as soon as
// it is decoded.
func (ll *Reader) serveSpooled(f *os.File, n int64, sc *idScanner) {
	line, err := unix.Mmap(int(f.Fd()), 0, int(n), unix.PROT_READ, unix.MAP_SHARED)
	f.Close()
	if err != nil {
		ll.log.Error("custodian: map a long agent message", "err", err)
		ll.answerRefusal(sc, lineRefusal{errcode.CodeBusy, "the custodian could not read a long message back; retry"})
		return
	}
	// decodeLong copies what it keeps, but a write's content, left in
	// line; once decoded, line's pages leave memory until the content's
	// passes read them again, and leave again as they are read.
	// While encoding/json reads all of line (twice: its syntax, then the
	// values), its pages are dropped every millisecond, so that no more
	// than the last read stay resident.
	stop := dropEvery(line, time.Millisecond)
	msg, derr, ok := ll.decodeLong(line, func(rest []byte) { dropRead(line, rest) })
	stop()
	dropRead(line, line[len(line):])
	if ok && msg.content == nil {
		unmap(ll.log, line) // nothing points into line
		line = nil
	}
	if ok {
		ll.runLong(msg, derr, int(n))
	}
	if line != nil {
		unmap(ll.log, line) // served: msg.content is no longer read
	}
}

// dropRead lets the pages of line before rest (a subslice of line: what
// is still to be read in this pass) leave the process's memory
// (MADV_DONTNEED): line maps a file no one writes, so a later read of
// them reads them back from it unchanged. The mapping starts on a page;
// rest's offset is how much of line's capacity is gone before it.
func dropRead(line, rest []byte) {
	off := cap(line) - cap(rest)
	if end := off &^ (os.Getpagesize() - 1); end > 0 {
		_ = unix.Madvise(line[:end], unix.MADV_DONTNEED) // only memory is at stake: a failure keeps the pages
	}
}

// dropEvery drops all of line's pages (dropRead) every period until the
// returned stop is called, which waits for the last drop.
func dropEvery(line []byte, period time.Duration) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				dropRead(line, line[len(line):])
			}
		}
	}()
	return func() { close(done); <-ended }
}

// unmap unmaps a long line's mapping, logging a failure.
func unmap(log *slog.Logger, line []byte) {
	if err := unix.Munmap(line); err != nil {
		log.Error("custodian: unmap a long agent message", "err", err)
	}
}

// fill writes head and the rest of its line to f, scanning every byte
// with sc, and returns the line's length; past lc.perLine it stops
// writing and returns a too_large refusal with the rest of the line
// still unread. An error is the end of the agent's output inside the
// line.
func (ll *Reader) fill(f *os.File, sc *idScanner, head [][]byte) (int64, *lineRefusal, error) {
	spoolFailed := &lineRefusal{errcode.CodeBusy, "the custodian could not spool a long message; retry"}
	n := int64(0)
	for _, p := range head {
		n += int64(len(p))
		if _, err := f.Write(p); err != nil {
			ll.log.Error("custodian: spool a long agent message", "err", err)
			return n, spoolFailed, nil
		}
	}
	var err error
	for !sc.ended() && err == nil {
		var part []byte
		part, err = ll.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			err = nil
		}
		sc.Write(part)
		if n += int64(len(part)); n > ll.caps.perLine {
			return n, ll.tooLarge(), nil
		}
		if _, werr := f.Write(part); werr != nil {
			ll.log.Error("custodian: spool a long agent message", "err", werr)
			return n, spoolFailed, nil
		}
	}
	if !sc.ended() {
		return n, nil, err
	}
	return n, nil, nil
}

// tooLarge is the refusal of a line past the bound of one line.
func (ll *Reader) tooLarge() *lineRefusal {
	return &lineRefusal{errcode.CodeTooLarge, fmt.Sprintf("message longer than %d bytes, the most the custodian holds for one", ll.caps.perLine)}
}

// refuseLong reads the rest of a refused line (when the newline has not
// been read yet, sc has not seen it), scanning it for the id without
// holding it, and answers the request, if it is one.
func (ll *Reader) refuseLong(sc *idScanner, r lineRefusal) error {
	for !sc.ended() {
		part, err := ll.br.ReadSlice('\n')
		sc.Write(part)
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) && !sc.ended() {
			return err // the agent's output ended inside the line: no answer
		}
	}
	ll.answerRefusal(sc, r)
	return nil
}

// answerRefusal counts a refused long message in the connection's
// refusals (audit kind refusals, without a session id: the session of a
// message not decoded is not known) and answers it with its code, or,
// with no id (a notification, a response or no JSON-RPC object), logs
// that it was dropped.
func (ll *Reader) answerRefusal(sc *idScanner, r lineRefusal) {
	if ll.srv != nil {
		ll.srv.Refused(r.code, sc.methodName())
	}
	id := sc.id()
	if id == nil {
		ll.log.Warn("custodian: dropped a long agent message that is not a request", "code", string(r.code))
		return
	}
	// Written on its own goroutine, as the SDK writes its answers: the
	// reader never waits for an agent that does not read.
	ll.calls.Go(func() { ll.answer(id, nil, acperr.NewError(r.code, "%s", r.why)) })
}
