package egress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tetherdev/tether/egress/addrcheck"
	"github.com/tetherdev/tether/egress/policy"
)

// MaxHead bounds an HTTP request's line and headers.
const MaxHead = 32 << 10

// errHeadTooLarge is returned by readHead past MaxHead.
var errHeadTooLarge = errors.New("request head larger than 32 KiB")

// readHead reads the request line and headers, up to and including the
// empty line, under the caller's deadline.
func readHead(br *bufio.Reader) ([]byte, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		head = append(head, line...)
		switch {
		case len(head) > MaxHead:
			return nil, errHeadTooLarge
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			return nil, err
		case len(line) <= 2 && strings.TrimRight(string(line), "\r\n") == "":
			return head, nil
		}
	}
}

// serveHTTP answers one HTTP request: CONNECT opens a tunnel, an
// absolute-form request is forwarded, and the connection closes after it.
func (c *computer) serveHTTP(s *session, br *bufio.Reader) {
	s.target("http", "", 0)
	head, err := readHead(br)
	if err != nil {
		r := s.refuse(&refusal{check: policy.CheckProtocol, reason: "reading the request: " + err.Error()})
		writeStatus(s.client, http.StatusBadRequest, "Bad Request", r.reason)
		return
	}
	hosts, err := hostHeaders(head)
	if err != nil {
		r := s.refuse(&refusal{check: policy.CheckProtocol, reason: err.Error()})
		writeStatus(s.client, http.StatusBadRequest, "Bad Request", r.reason)
		return
	}
	if len(hosts) > 1 {
		writeRefusal(s.client, hosts[0], s.refuse(&refusal{check: policy.CheckHostHeader,
			reason: fmt.Sprintf("%d Host headers", len(hosts))}))
		return
	}
	req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(bytes.NewReader(head), br)))
	if err != nil {
		r := s.refuse(&refusal{check: policy.CheckProtocol, reason: "malformed request: " + err.Error()})
		writeStatus(s.client, http.StatusBadRequest, "Bad Request", r.reason)
		return
	}
	if req.Method == http.MethodConnect {
		c.serveConnect(s, br, req)
		return
	}
	c.forward(s, req, hosts)
}

// hostHeaders returns the Host header values of a raw head, which
// http.ReadRequest hides for an absolute-form request.
func hostHeaders(head []byte) ([]string, error) {
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	if _, err := tp.ReadLine(); err != nil {
		return nil, err
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("malformed headers: %w", err)
	}
	return h.Values("Host"), nil
}

// splitPort reads "host:port" (IPv6 in brackets), port required unless
// def is not zero.
func splitPort(authority string, def uint16) (string, uint16, error) {
	host, p, err := net.SplitHostPort(authority)
	if err != nil {
		if def == 0 || strings.HasSuffix(authority, ":") {
			return "", 0, fmt.Errorf("authority %q: %v", authority, err)
		}
		return strings.TrimSuffix(strings.TrimPrefix(authority, "["), "]"), def, nil
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("authority %q: bad port", authority)
	}
	return host, uint16(n), nil
}

// serveConnect checks the CONNECT target, connects, answers 200 and
// hands the stream to tunnel.
func (c *computer) serveConnect(s *session, br *bufio.Reader, req *http.Request) {
	s.target("connect", req.Host, 0)
	host, port, err := splitPort(req.RequestURI, 0)
	if err != nil {
		r := s.refuse(&refusal{check: policy.CheckProtocol, reason: "CONNECT target: " + err.Error()})
		writeRefusal(s.client, req.RequestURI, r)
		return
	}
	s.target("connect", host, port)
	up, r := c.connect(s, host, port)
	if r != nil {
		writeRefusal(s.client, hostPort(host, port), r)
		return
	}
	if up == nil {
		writeStatus(s.client, http.StatusBadGateway, "Bad Gateway", s.failure)
		return
	}
	if _, err := io.WriteString(s.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	c.tunnel(s, br, up)
}

// forward sends one absolute-form http:// request to the checked address
// and copies the answer back as it comes; redirects are the client's to
// follow, through the proxy again.
func (c *computer) forward(s *session, req *http.Request, hosts []string) {
	host, port, r := checkAbsolute(req, hosts)
	s.target("http", host, port)
	if r != nil {
		writeRefusal(s.client, req.Host, s.refuse(r))
		return
	}
	up, r := c.connect(s, host, port)
	if r != nil {
		writeRefusal(s.client, hostPort(host, port), r)
		return
	}
	if up == nil {
		writeStatus(s.client, http.StatusBadGateway, "Bad Gateway", s.failure)
		return
	}
	s.client.SetReadDeadline(time.Time{})
	prepareOutbound(req)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.copyCounted(s, s.client, up, false)
	}()
	if err := req.Write(&limitedWriter{c: c, s: s, w: up, up: true}); err != nil {
		up.Close()
	}
	<-done
}

// checkAbsolute: the request is absolute-form http://, and every Host
// header names the URL's host and port.
func checkAbsolute(req *http.Request, hosts []string) (string, uint16, *refusal) {
	u := req.URL
	if !u.IsAbs() || u.Scheme != "http" || u.Host == "" || u.User != nil {
		return "", 0, &refusal{check: policy.CheckProtocol, reason: fmt.Sprintf(
			"the proxy forwards absolute http:// URLs without user info only (use CONNECT for https), not %q", req.RequestURI)}
	}
	host, port, err := splitPort(u.Host, 80)
	if err != nil {
		return "", 0, &refusal{check: policy.CheckProtocol, reason: err.Error()}
	}
	for _, h := range hosts {
		if !sameAuthority(h, host, port) {
			return host, port, &refusal{check: policy.CheckHostHeader, reason: fmt.Sprintf(
				"the Host header %q is not the URL's host %q", sanitize(h, 100), hostPort(host, port))}
		}
	}
	return host, port, nil
}

// sameAuthority compares a Host header with a URL's host and port, both
// read as curl would (so "0x7f.1" and "127.0.0.1" are the same host).
func sameAuthority(header, host string, port uint16) bool {
	hh, hp, err := splitPort(header, 80)
	if err != nil || hp != port {
		return false
	}
	a, err1 := addrcheck.ParseHost(hh)
	b, err2 := addrcheck.ParseHost(host)
	return err1 == nil && err2 == nil && a == b
}

// prepareOutbound drops hop-by-hop and proxy headers and asks the
// destination to close after its answer.
func prepareOutbound(req *http.Request) {
	for _, f := range req.Header.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			req.Header.Del(strings.TrimSpace(name))
		}
	}
	for _, h := range []string{"Connection", "Proxy-Connection", "Proxy-Authorization", "Keep-Alive", "Upgrade", "Te", "Trailer"} {
		req.Header.Del(h)
	}
	req.Close = true
	req.RequestURI = ""
	req.URL = &url.URL{Scheme: "http", Host: req.URL.Host, Path: req.URL.Path, RawPath: req.URL.RawPath,
		RawQuery: req.URL.RawQuery}
}
