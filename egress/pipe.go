package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/tetherdev/tether/egress/policy"
)

// copyBuf is the size of one copy's buffer.
const copyBuf = 32 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, copyBuf); return &b }}

// errTotal is returned when the computer reaches its total bytes.
var errTotal = errors.New("total bytes reached")

// limitedWrite waits for the computer's rate limit, counts p against its
// totals, then writes it. up says which way p goes.
func (c *computer) limitedWrite(s *session, w io.Writer, p []byte, up bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := c.lim.WaitN(s.ctx, len(p)); err != nil {
		return 0, err
	}
	if lim := c.p.cfg.Limits.TotalBytes; lim > 0 && c.total.Add(int64(len(p))) > lim {
		s.refuse(&refusal{check: policy.CheckLimit, reason: fmt.Sprintf("the computer used its %d bytes", lim)})
		s.close()
		return 0, errTotal
	}
	n, err := w.Write(p)
	s.mu.Lock()
	if up {
		s.up += int64(n)
	} else {
		s.down += int64(n)
	}
	s.mu.Unlock()
	if up {
		c.up.Add(int64(n))
	} else {
		c.down.Add(int64(n))
	}
	return n, err
}

// limitedWriter is an io.Writer through limitedWrite.
type limitedWriter struct {
	c  *computer
	s  *session
	w  io.Writer
	up bool
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	for done := 0; done < len(p); {
		n, err := l.c.limitedWrite(l.s, l.w, p[done:min(len(p), done+copyBuf)], l.up)
		done += n
		if err != nil {
			return done, err
		}
	}
	return len(p), nil
}

// smallBuf is the buffer a copy starts with, so that an idle tunnel
// holds little; the first read that fills it moves the copy to a pooled
// copyBuf.
const smallBuf = 2 << 10

// copyCounted copies src to dst through limitedWrite until either ends.
func (c *computer) copyCounted(s *session, dst io.Writer, src io.Reader, up bool) error {
	buf := make([]byte, smallBuf)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := c.limitedWrite(s, dst, buf[:n], up); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if n == len(buf) && len(buf) == smallBuf {
			bp := bufPool.Get().(*[]byte)
			defer bufPool.Put(bp)
			buf = *bp
		}
	}
}

// closeWriter is a connection that can half-close.
type closeWriter interface{ CloseWrite() error }

// pipe joins the client (read through src, which may hold buffered
// bytes) and up both ways, half-closing each side as the other ends, and
// returns when both directions are done.
func (c *computer) pipe(s *session, src io.Reader, up net.Conn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := c.copyCounted(s, up, src, true)
		halfClose(up, err)
	}()
	err := c.copyCounted(s, s.client, up, false)
	halfClose(s.client, err)
	wg.Wait()
}

// halfClose ends the write side of conn after a clean end, and all of it
// after an error, so the other direction ends too.
func halfClose(conn net.Conn, err error) {
	if cw, ok := conn.(closeWriter); ok && err == nil {
		cw.CloseWrite()
		return
	}
	conn.Close()
}
