package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/time/rate"

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
	if err := c.charge(s, int64(len(p))); err != nil {
		return 0, err
	}
	n, err := w.Write(p)
	c.count(s, int64(n), up)
	return n, err
}

// charge waits for n bytes of the computer's rate and adds them to its
// total; at the total it refuses and closes the session.
func (c *computer) charge(s *session, n int64) error {
	if err := c.lim.WaitN(s.ctx, int(n)); err != nil {
		return err
	}
	if lim := c.p.cfg.Limits.TotalBytes; lim > 0 && c.total.Add(n) > lim {
		s.refuse(&refusal{check: policy.CheckLimit, reason: fmt.Sprintf("the computer used its %d bytes", lim)})
		s.close()
		return errTotal
	}
	return nil
}

// count adds n moved bytes to the session's and the computer's counters.
func (c *computer) count(s *session, n int64, up bool) {
	s.mu.Lock()
	if up {
		s.up += n
	} else {
		s.down += n
	}
	s.mu.Unlock()
	if up {
		c.up.Add(n)
	} else {
		c.down.Add(n)
	}
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

// copyCounted copies src to dst through the computer's limits until
// either ends. It starts with a small buffer, so that an idle tunnel
// holds little; after the first read that fills it, it moves to the
// kernel's splice where both ends are TCP connections, else to a pooled
// copyBuf.
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
			break
		}
	}
	if d, ok := dst.(*net.TCPConn); ok {
		if sc, ok := src.(*net.TCPConn); ok {
			return c.spliceCounted(s, d, sc, up)
		}
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf = *bp
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
	}
}

// spliceChunk bounds one splice between two charges of the limits.
const spliceChunk = 1 << 20

// spliceCounted moves src to dst in the kernel (net.TCPConn.ReadFrom of
// an io.LimitedReader splices), a chunk at a time, charging each chunk
// before it moves: no more than the rate's burst, nor than the total
// left.
func (c *computer) spliceCounted(s *session, dst, src *net.TCPConn, up bool) error {
	chunk := int64(spliceChunk)
	if b := c.lim.Burst(); c.lim.Limit() != rate.Inf && int64(b) < chunk {
		chunk = int64(b)
	}
	for {
		if err := c.charge(s, chunk); err != nil {
			return err
		}
		n, err := dst.ReadFrom(&io.LimitedReader{R: src, N: chunk})
		c.count(s, n, up)
		if n < chunk {
			c.refund(chunk - n)
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// refund gives back bytes charged but not moved (the rate's tokens are
// not returned: they only bound the pace).
func (c *computer) refund(n int64) {
	if c.p.cfg.Limits.TotalBytes > 0 {
		c.total.Add(-n)
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
