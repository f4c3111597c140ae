// Package httpserver is the HTTP face of the computer service: an
// http.Handler over api.Backend that decodes every body strictly, checks
// the wire's bounds before the backend is called, takes the caller from
// its credential (unix-socket peer credentials, or a bearer token whose
// hash is in the token file) and answers every error as {"code",
// "message"} with a code of the closed set (computer/api). It also holds
// the listeners: a unix socket that admits root and one group by
// SO_PEERCRED, and TCP with TLS 1.3 only.
package httpserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// Config is what a Server needs.
type Config struct {
	// Backend serves the calls; required.
	Backend api.Backend
	// Tokens admits bearer tokens; nil admits none (the unix socket
	// still admits its peers).
	Tokens *Tokens
	// Audit receives every audited event; nil logs them to Logger.
	Audit func(AuditRecord)
	// Logger receives internal errors; nil is slog.Default().
	Logger *slog.Logger
	// MaxBodyBytes caps a request body; 0 is MaxBodyBytes, and more is
	// refused.
	MaxBodyBytes int
	// MaxStreamBytes caps an import's or a copy in's body, which is
	// streamed to the backend, not decoded; 0 is DefaultMaxStreamBytes.
	MaxStreamBytes int64
}

// Server is the API's http.Handler. Its methods may be called from
// several goroutines once Mount calls are done.
type Server struct {
	cfg Config
	mux *http.ServeMux
}

var _ http.Handler = (*Server)(nil)

// New checks cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil {
		return nil, errors.New("httpserver: no backend")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = MaxBodyBytes
	}
	if cfg.MaxBodyBytes < 0 || cfg.MaxBodyBytes > MaxBodyBytes {
		return nil, fmt.Errorf("httpserver: body limit %d outside 1 to %d", cfg.MaxBodyBytes, MaxBodyBytes)
	}
	if cfg.MaxStreamBytes == 0 {
		cfg.MaxStreamBytes = DefaultMaxStreamBytes
	}
	if cfg.MaxStreamBytes < 0 {
		return nil, fmt.Errorf("httpserver: stream limit %d is negative", cfg.MaxStreamBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Audit == nil {
		cfg.Audit = SlogAudit(cfg.Logger)
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	s.routes()
	return s, nil
}

// route is one endpoint: a ServeMux pattern ("METHOD /path/{id}", the
// OpenAPI document's path syntax) and its handler.
type route struct {
	pattern string
	handler http.Handler
}

// routeTable lists every endpoint of the OpenAPI document (a test checks
// the two lists are the same).
func (s *Server) routeTable() []route {
	return []route{
		{"GET /healthz", http.HandlerFunc(serveHealthz)},
		{"GET /v1/openapi.json", http.HandlerFunc(serveOpenAPI)},
		{"POST /v1/computers", s.authed(s.create)},
		{"GET /v1/computers", s.authed(s.list)},
		{"GET /v1/computers/{id}", s.authed(s.withID(s.get))},
		{"DELETE /v1/computers/{id}", s.authed(s.withID(s.delete))},
		{"POST /v1/computers/{id}/renew", s.authed(s.withID(s.renew))},
		{"POST /v1/computers/{id}/suspend", s.authed(s.withID(s.suspend))},
		{"POST /v1/computers/{id}/resume", s.authed(s.withID(s.resume))},
		{"POST /v1/computers/{id}/touch", s.authed(s.withID(s.touch))},
		{"GET /v1/computers/{id}/receipts", s.authed(s.withID(s.receipts))},
		{"GET /v1/computers/{id}/egress", s.authed(s.withID(s.getEgress))},
		{"PUT /v1/computers/{id}/egress", s.authed(s.withID(s.putEgress))},
		{"GET /v1/computers/{id}/export", s.authed(s.withID(s.export))},
		{"POST /v1/computers/import", s.authed(s.importComputer)},
		{"PUT /v1/computers/{id}/files", s.authed(s.withID(s.copyIn))},
		{"GET /v1/computers/{id}/files", s.authed(s.withID(s.copyOut))},
		{"POST /v1/computers/{id}/links", s.authed(s.withID(s.link))},
		{"GET /v1/events", s.authed(s.events)},
	}
}

// routes registers the endpoints, and not_found for any other request.
func (s *Server) routes() {
	for _, r := range s.routeTable() {
		s.mux.Handle(r.pattern, r.handler)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.Error{Code: api.CodeNotFound, Message: "no such endpoint"})
	})
}

// Mount serves h at pattern (a ServeMux pattern such as "GET /metrics")
// to admin callers only: what such a handler shows (metrics name every
// owner's computers) is not an owner's to see. Call it before serving.
func (s *Server) Mount(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.authed(func(w http.ResponseWriter, r *http.Request, c api.Caller) {
		if !c.Admin {
			s.auditf(r, c, AuditNotFound, "", api.CodeNotFound)
			writeError(w, api.Error{Code: api.CodeNotFound, Message: "no such endpoint"})
			return
		}
		h.ServeHTTP(w, r)
	}))
}

// ServeHTTP serves one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Serve serves HTTP on l until ctx ends, then shuts down and returns; l
// is closed on return. Every request's context derives from ctx, so its
// end also ends event streams and drops creates waiting in the queue;
// what is still running gets up to 5 s to answer. A
// *PeerListener's peers act as their peer credentials; on any other
// listener a bearer token is required.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ConnContext:       connContext,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	if e := <-done; !errors.Is(e, http.ErrServerClosed) {
		err = errors.Join(err, e)
	}
	return err
}

// TLSConfig is the TCP listener's TLS configuration: TLS 1.3 only, with
// cert as the server's certificate.
func TLSConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
}

// ListenTLS listens on addr (TCP) with TLSConfig(cert). The caller
// closes the listener (Serve does).
func ListenTLS(addr string, cert tls.Certificate) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return tls.NewListener(l, TLSConfig(cert)), nil
}

// handlerFunc is a handler that knows its caller.
type handlerFunc func(w http.ResponseWriter, r *http.Request, c api.Caller)

// authed resolves the caller (peer credentials, else a bearer token) and
// refuses, with 401 and an audit record, a request that has none.
func (s *Server) authed(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := s.caller(r)
		if !ok {
			s.auditf(r, api.Caller{Owner: "anonymous"}, AuditUnauthorized, "", api.CodeUnauthorized)
			writeError(w, api.Error{Code: api.CodeUnauthorized, Message: "a valid bearer token is required"})
			return
		}
		h(w, r, c)
	})
}

// caller is the request's credential: an admitted unix-socket peer, or
// an "Authorization: Bearer" token found in the token file.
func (s *Server) caller(r *http.Request) (api.Caller, bool) {
	if c, ok := peerCaller(r.Context()); ok {
		return c, true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || s.cfg.Tokens == nil {
		return api.Caller{}, false
	}
	return s.cfg.Tokens.Lookup(tok)
}

// withID checks the path's id before h runs.
func (s *Server) withID(h func(w http.ResponseWriter, r *http.Request, c api.Caller, id string)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, c api.Caller) {
		id := r.PathValue("id")
		if e := checkID(id); e != nil {
			writeError(w, *e)
			return
		}
		h(w, r, c, id)
	}
}

// auditf sends one audit record.
func (s *Server) auditf(r *http.Request, c api.Caller, action, id, outcome string) {
	who := c.Owner
	if c.Admin {
		who += " (admin)"
	}
	s.cfg.Audit(AuditRecord{Time: time.Now(), Who: who, Action: action, Method: r.Method,
		Path: r.URL.Path, ID: id, Outcome: outcome})
}

// fail answers a backend error; a not_found on an id is audited (it is
// what a request for another owner's computer answers), an internal
// error is logged with its detail and answered without it.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, c api.Caller, id string, err error) {
	body, known := errorBody(err)
	if !known {
		s.cfg.Logger.Error("backend", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if body.Code == api.CodeNotFound && id != "" {
		s.auditf(r, c, AuditNotFound, id, body.Code)
	}
	writeError(w, body)
}
