// Package client is a small Go client of the computer service's HTTP API
// (computer/api): over the daemon's unix socket, or over HTTPS (TLS 1.3)
// with a bearer token. Every error answer comes back as an *api.Error
// with its code; answers are decoded by the one strict decoder.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// Bounds of what the client reads.
const (
	maxAnswer = 16 << 20 // a list of many computers
	maxError  = 64 << 10
	maxEvent  = 64 << 10
)

// Client calls one daemon. Its methods may be called from several
// goroutines; it holds no connection the caller must close (idle ones
// are closed by CloseIdleConnections).
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// DefaultSocket is where the daemon listens unless told otherwise.
const DefaultSocket = "/run/tether-computer/api.sock"

// Unix returns a client of the daemon listening on the unix socket at
// path; the daemon knows the caller by its peer credentials.
func Unix(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns: 4,
	}
	return &Client{base: "http://tether-computer", hc: &http.Client{Transport: tr}}
}

// HTTPS returns a client of the daemon at baseURL ("https://host:port")
// that sends token as its bearer credential. tlsConf (nil: the system's
// roots) is cloned and held to TLS 1.3.
func HTTPS(baseURL, token string, tlsConf *tls.Config) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("client: base URL %q is not https://host[:port]", baseURL)
	}
	conf := &tls.Config{}
	if tlsConf != nil {
		conf = tlsConf.Clone()
	}
	conf.MinVersion = tls.VersionTLS13
	tr := &http.Transport{TLSClientConfig: conf, ForceAttemptHTTP2: true, MaxIdleConns: 4}
	return &Client{base: strings.TrimSuffix(baseURL, "/"), token: token, hc: &http.Client{Transport: tr}}, nil
}

// CloseIdleConnections closes the client's idle connections.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Create asks for a computer and waits until it runs (or the queue's
// timeout); cancelling ctx drops the request from the queue.
func (c *Client) Create(ctx context.Context, req api.CreateRequest) (api.Computer, error) {
	var out api.Computer
	return out, c.call(ctx, http.MethodPost, "/v1/computers", req, http.StatusCreated, &out)
}

// List returns the caller's computers (every owner's for an admin).
func (c *Client) List(ctx context.Context) ([]api.Computer, error) {
	var out api.ComputerList
	err := c.call(ctx, http.MethodGet, "/v1/computers", nil, http.StatusOK, &out)
	return out.Computers, err
}

// Get returns one computer.
func (c *Client) Get(ctx context.Context, id string) (api.Computer, error) {
	var out api.Computer
	return out, c.call(ctx, http.MethodGet, idPath(id, ""), nil, http.StatusOK, &out)
}

// Delete ends a computer.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, idPath(id, ""), nil, http.StatusNoContent, nil)
}

// Renew extends a computer's lease by ttl (whole seconds).
func (c *Client) Renew(ctx context.Context, id string, ttl time.Duration) (api.Computer, error) {
	var out api.Computer
	req := api.RenewRequest{LeaseTTLSeconds: int64(ttl / time.Second)}
	return out, c.call(ctx, http.MethodPost, idPath(id, "/renew"), req, http.StatusOK, &out)
}

// Egress returns a computer's egress policy.
func (c *Client) Egress(ctx context.Context, id string) (api.EgressInfo, error) {
	var out api.EgressInfo
	return out, c.call(ctx, http.MethodGet, idPath(id, "/egress"), nil, http.StatusOK, &out)
}

// SetEgress replaces a running or suspended computer's egress policy and
// returns what the service stored.
func (c *Client) SetEgress(ctx context.Context, id string, pol policy.Policy) (api.EgressInfo, error) {
	var out api.EgressInfo
	return out, c.call(ctx, http.MethodPut, idPath(id, "/egress"), pol, http.StatusOK, &out)
}

// Link mints a one-time link to the live view of a running computer
// with a screen (role api.LinkRoleView or api.LinkRoleControl; ttl 0
// is the service's default). The link is a secret: whoever opens it
// first is the viewer.
func (c *Client) Link(ctx context.Context, id, role string, ttl time.Duration) (api.Link, error) {
	var out api.Link
	req := api.LinkRequest{Role: role, TTLSeconds: int64(ttl / time.Second)}
	return out, c.call(ctx, http.MethodPost, idPath(id, "/links"), req, http.StatusCreated, &out)
}

// Suspend freezes a computer.
func (c *Client) Suspend(ctx context.Context, id string) (api.Computer, error) {
	var out api.Computer
	return out, c.call(ctx, http.MethodPost, idPath(id, "/suspend"), nil, http.StatusOK, &out)
}

// Resume thaws a computer.
func (c *Client) Resume(ctx context.Context, id string) (api.Computer, error) {
	var out api.Computer
	return out, c.call(ctx, http.MethodPost, idPath(id, "/resume"), nil, http.StatusOK, &out)
}

// OpenAPI returns the daemon's OpenAPI document.
func (c *Client) OpenAPI(ctx context.Context) ([]byte, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/openapi.json", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, answerError(resp)
	}
	return io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
}

// Health returns nil when the daemon answers /healthz with ok.
func (c *Client) Health(ctx context.Context) error {
	resp, err := c.do(ctx, http.MethodGet, "/healthz", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK || string(b) != "ok\n" {
		return fmt.Errorf("healthz: HTTP %d %q", resp.StatusCode, b)
	}
	return nil
}

func idPath(id, suffix string) string {
	return "/v1/computers/" + url.PathEscape(id) + suffix
}

// call sends body (JSON, or none when nil), expects want, and decodes
// the answer strictly into out (when not nil).
func (c *Client) call(ctx context.Context, method, path string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, rd)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return answerError(resp)
	}
	if out == nil {
		return nil
	}
	if err := strictjson.Read(resp.Body, maxAnswer, out); err != nil {
		return fmt.Errorf("client: %s %s: answer: %w", method, path, err)
	}
	return nil
}

// do sends one request with the client's credential.
func (c *Client) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.send(req)
}

// send sends req with the client's credential.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: %s %s: %w", req.Method, req.URL.Path, err)
	}
	return resp, nil
}

// answerError decodes an error answer into an *api.Error; an answer that
// is not one is internal, naming the status.
func answerError(resp *http.Response) error {
	var e api.Error
	if err := strictjson.Read(resp.Body, maxError, &e); err != nil || e.Code == "" {
		return &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("HTTP %d without an error body", resp.StatusCode)}
	}
	return &e
}

// EventStream reads the daemon's event stream. Close it when done.
type EventStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Events opens the event stream; it ends when ctx ends, the daemon goes,
// or Close is called.
func (c *Client) Events(ctx context.Context) (*EventStream, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/events", nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, answerError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), maxEvent)
	return &EventStream{body: resp.Body, sc: sc}, nil
}

// ErrStreamEnded is Next's error once the stream ended cleanly.
var ErrStreamEnded = errors.New("event stream ended")

// Next returns the next event. Lines other than "data:" (comments, other
// fields, blank separators) are skipped.
func (s *EventStream) Next() (api.Event, error) {
	for s.sc.Scan() {
		data, ok := strings.CutPrefix(s.sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev api.Event
		if err := strictjson.Decode([]byte(data), maxEvent, &ev); err != nil {
			return ev, fmt.Errorf("client: event: %w", err)
		}
		return ev, nil
	}
	if err := s.sc.Err(); err != nil {
		return api.Event{}, fmt.Errorf("client: event stream: %w", err)
	}
	return api.Event{}, ErrStreamEnded
}

// Close ends the stream; safe to call twice.
func (s *EventStream) Close() error { return s.body.Close() }
