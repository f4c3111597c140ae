package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/egress/socks5"
	"github.com/tetherdev/tether/egress/tlspeek"
)

// dispatch reads the first byte: 5 is a SOCKS5 greeting, anything else
// is taken for HTTP. The whole request must arrive within HeaderTimeout.
func (c *computer) dispatch(s *session) {
	s.client.SetReadDeadline(time.Now().Add(c.p.cfg.HeaderTimeout))
	br := bufio.NewReaderSize(s.client, 4096)
	first, err := br.Peek(1)
	if err != nil {
		s.refuse(&refusal{check: policy.CheckProtocol, reason: "no request: " + err.Error(), quiet: errors.Is(err, io.EOF)})
		return
	}
	if first[0] == socks5.Version {
		c.serveSOCKS(s, br)
		return
	}
	c.serveHTTP(s, br)
}

// serveSOCKS answers a SOCKS5 CONNECT. A refusal is reply 2 ("not
// allowed by ruleset"); the reason goes to the callback and the log.
func (c *computer) serveSOCKS(s *session, br *bufio.Reader) {
	s.target("socks5", "", 0)
	req, err := socks5.Handshake(br, s.client)
	if err != nil {
		var se *socks5.Error
		if errors.As(err, &se) && se.Code != 0 {
			socks5.Reply(s.client, se.Code)
		}
		s.refuse(&refusal{check: policy.CheckProtocol, reason: err.Error()})
		return
	}
	s.target("socks5", req.Host, req.Port)
	up, r := c.connect(s, req.Host, req.Port)
	if r != nil {
		socks5.Reply(s.client, socks5.NotAllowed)
		return
	}
	if up == nil {
		socks5.Reply(s.client, socks5.HostUnreachable)
		return
	}
	if err := socks5.Reply(s.client, socks5.Succeeded); err != nil {
		return
	}
	c.tunnel(s, br, up)
}

// connect checks host:port and connects to the checked address. It returns
// the refusal, or (nil, nil) when the destination was allowed but could
// not be reached (recorded as a failure).
func (c *computer) connect(s *session, host string, port uint16) (net.Conn, *refusal) {
	if lim := c.p.cfg.Limits.TotalBytes; lim > 0 && c.total.Load() >= lim {
		return nil, s.refuse(&refusal{check: policy.CheckLimit, reason: fmt.Sprintf("the computer used its %d bytes", lim)})
	}
	d, r := c.check(s.ctx, host, port)
	if r != nil {
		return nil, s.refuse(r)
	}
	if r := s.settle(d); r != nil {
		return nil, r
	}
	up, err := c.dial(s.ctx, s, d)
	if err != nil {
		s.fail(err.Error())
		return nil, nil
	}
	if !s.setUpstream(up) {
		return nil, nil
	}
	return up, nil
}

// tunnel checks what the stream carries, replays the bytes read, and
// joins the two connections. A tunnel must carry TLS whose server name
// (SNI) is the host asked for; the policy's AllowNoSNI admits a
// ClientHello without one, or a stream that is not TLS.
func (c *computer) tunnel(s *session, br *bufio.Reader, up net.Conn) {
	pol := s.dest.pol
	s.client.SetReadDeadline(time.Now().Add(c.p.cfg.HeaderTimeout))
	hello, replay, err := tlspeek.Peek(br)
	s.client.SetReadDeadline(time.Time{})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded) && pol.AllowNoSNI && len(replay) == 0:
	case err != nil && !(pol.AllowNoSNI && !hello.TLS):
		s.refuse(&refusal{check: policy.CheckSNI, reason: "the tunnel's first bytes are not a ClientHello: " + err.Error()})
		return
	case hello.TLS && hello.ServerName != "":
		if want := s.dest.host.String(); hello.ServerName != want {
			s.refuse(&refusal{check: policy.CheckSNI, reason: fmt.Sprintf(
				"the TLS server name %q is not the host asked for, %q (domain fronting)", hello.ServerName, want)})
			return
		}
	case !pol.AllowNoSNI:
		what := "a TLS ClientHello without a server name"
		if !hello.TLS {
			what = "a stream that is not TLS"
		}
		s.refuse(&refusal{check: policy.CheckSNI, reason: what + " (the policy does not allow no-SNI tunnels)"})
		return
	}
	// Through limitedWriter: a ClientHello may be longer than the rate's
	// burst, which one limitedWrite could never be granted.
	if _, err := (&limitedWriter{c: c, s: s, w: up, up: true}).Write(replay); err != nil {
		return
	}
	c.pipe(s, br, up)
}

// sanitize makes text fit an HTTP status line: printable ASCII, bounded.
func sanitize(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= max {
			break
		}
		if r < 0x20 || r > 0x7e {
			r = '?'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// writeRefusal answers an HTTP client: 403 with the reason in the status
// text and the body, so curl and pip show it.
func writeRefusal(conn net.Conn, host string, r *refusal) {
	body := fmt.Sprintf("tether egress refused %s: %s (check %s)\n", host, r.reason, r.check)
	fmt.Fprintf(conn, "HTTP/1.1 403 Forbidden by tether egress: %s\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"X-Tether-Egress-Check: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		sanitize(r.reason, 300), r.check, len(body), body)
}

// writeStatus answers an HTTP client with a short status and body.
func writeStatus(conn net.Conn, code int, text, detail string) {
	body := sanitize(detail, 1000) + "\n"
	fmt.Fprintf(conn, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"+
		"Connection: close\r\n\r\n%s", code, text, len(body), body)
}
