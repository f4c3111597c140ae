package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/tetherdev/tether/egress/addrcheck"
	"github.com/tetherdev/tether/egress/egresslog"
	"github.com/tetherdev/tether/egress/policy"
)

// session is one connection a computer opened to the proxy.
type session struct {
	c      *computer
	client net.Conn
	start  time.Time
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	proto    string // http, connect, socks5
	host     string // as asked
	port     uint16
	dest     *dest // set once checked
	upstream net.Conn
	refusal  *refusal // the first refusal, if any
	failure  string   // a failure that is not a refusal (the dial)
	closed   bool
	up, down int64
}

// dest is a checked destination: the connection goes to one of addrs.
type dest struct {
	host  addrcheck.Host
	port  uint16
	addrs []netip.Addr
	addr  netip.Addr // the one connected to
	rule  string
	pol   *policy.Compiled // the policy it was checked under
}

// refusal is a failed check, as the Refusal and the log record show it.
type refusal struct {
	check, reason string
	addr          netip.Addr
	// quiet keeps it from the callback (a connection closed before it
	// asked for anything); the log still records it.
	quiet bool
}

func (r *refusal) Error() string { return r.check + ": " + r.reason }

func newSession(c *computer, conn net.Conn) *session {
	s := &session{c: c, client: conn, start: now()}
	s.ctx, s.cancel = context.WithCancel(c.ctx)
	return s
}

// refuse records r as the session's refusal (the first one wins), hands
// it to the computer's callback, and returns it.
func (s *session) refuse(r *refusal) *refusal {
	r.reason = clip(r.reason, maxReason)
	s.mu.Lock()
	first := s.refusal == nil
	if first {
		s.refusal = r
	}
	host, port := s.host, s.port
	s.mu.Unlock()
	if first && !r.quiet {
		ref := policy.Refusal{Time: now(), Host: host, Port: port, Check: r.check, Reason: r.reason}
		if r.addr.IsValid() {
			ref.Addr = r.addr.String()
		}
		s.c.report(ref)
	}
	return r
}

// close closes both connections and cancels the session's context; safe
// twice and concurrently with the session's own goroutines.
func (s *session) close() {
	s.mu.Lock()
	s.closed = true
	up := s.upstream
	s.mu.Unlock()
	s.cancel()
	s.client.Close()
	if up != nil {
		up.Close()
	}
}

// setUpstream hands the dialed connection to the session; false (and up
// closed) if the session was closed meanwhile.
func (s *session) setUpstream(up net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		up.Close()
		return false
	}
	s.upstream = up
	return true
}

// settle records d as the session's destination; if the policy changed
// while d was checked, it checks d again under the current one.
func (s *session) settle(d *dest) *refusal {
	s.mu.Lock()
	s.dest = d
	s.mu.Unlock()
	if cur := s.c.pol.Load(); cur != d.pol {
		if r := s.c.allowed(cur, d); r != nil {
			return s.refuse(r)
		}
	}
	return nil
}

// recheck closes the session if pol no longer allows its destination.
func (s *session) recheck(pol *policy.Compiled) {
	s.mu.Lock()
	d := s.dest
	s.mu.Unlock()
	if d == nil {
		return
	}
	if r := s.c.allowed(pol, d); r != nil {
		s.refuse(&refusal{check: policy.CheckPolicyChanged, addr: r.addr,
			reason: "the policy changed and no longer allows this destination: " + r.reason})
		s.close()
	}
}

// serve runs one session to its end and records it.
func (c *computer) serve(s *session) {
	defer c.unregister(s)
	defer s.finish()
	if !c.acquire() {
		s.refuse(&refusal{check: policy.CheckLimit,
			reason: fmt.Sprintf("the computer has %d connections open, its limit", cap(c.slots))})
		return
	}
	defer c.release()
	c.dispatch(s)
}

// finish closes the session and appends its record to the egress log.
func (s *session) finish() {
	s.close()
	s.mu.Lock()
	rec := egresslog.Record{Time: s.start, Computer: s.c.id, Proto: s.proto, Host: s.host, Port: s.port,
		Verdict: egresslog.Allowed, Up: s.up, Down: s.down, Micros: time.Since(s.start).Microseconds()}
	if s.dest != nil {
		rec.Rule = s.dest.rule
		if s.dest.addr.IsValid() {
			rec.Addr = s.dest.addr.String()
		}
	}
	switch {
	case s.refusal != nil:
		rec.Verdict, rec.Check, rec.Reason = egresslog.Refused, s.refusal.check, s.refusal.reason
		if s.refusal.addr.IsValid() {
			rec.Addr = s.refusal.addr.String()
		}
	case s.failure != "":
		rec.Verdict, rec.Reason = egresslog.Failed, s.failure
	}
	s.mu.Unlock()
	// A failed append has no one to answer; the next Verify shows the gap.
	_, _ = s.c.p.log.Append(rec)
}

// target records what the client asked for, clipped (a client may ask
// for a host of 32 KiB, which is refused, but recorded in part) and
// printable: a host that is not printable ASCII (a SOCKS5 name is any
// bytes; no valid host is) is recorded Go-escaped, so that no reader of a
// Refusal or a record, such as a jail printing refusals on its stderr,
// gets a newline or a terminal escape from a computer.
func (s *session) target(proto, host string, port uint16) {
	host = printable(clip(host, maxHost))
	s.mu.Lock()
	s.proto, s.host, s.port = proto, host, port
	s.mu.Unlock()
}

func (s *session) fail(reason string) {
	s.mu.Lock()
	s.failure = clip(reason, maxReason)
	s.mu.Unlock()
}

func hostPort(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// Bounds on what a record and a refusal carry from the client: with JSON
// escaping (at most 6 bytes for one) a record stays within
// egresslog.MaxLine, so no request can make the log unverifiable.
const (
	maxHost   = 300  // a DNS name has at most 253 bytes
	maxReason = 1024 // reasons quote the client's host and request line
)

// printable returns s, or s Go-escaped (without the quotes) when it has
// a byte outside printable ASCII.
func printable(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			q := strconv.QuoteToASCII(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}

// clip cuts s to max bytes, marking the cut.
func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return s[:max] + "...(clipped)"
}
