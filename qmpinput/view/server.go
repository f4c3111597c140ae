package view

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/rfb"
	"github.com/tetherdev/tether/qmpinput/token"
)

// Defaults.
const (
	DefaultMaxHold = 15 * time.Minute
	// sweepEvery is how often open viewers' tokens are checked, so a
	// revocation by tether-qmp token revoke (another process) closes them
	// and ends their hold within this period.
	sweepEvery = 250 * time.Millisecond
)

// Config configures a Server. Adapter, VNC, Tokens, Auditor and Origins
// are required.
type Config struct {
	// Adapter is the agent's adapter; its Handover is the arbiter's, and
	// its Config.Audit must be Auditor.Record.
	Adapter *qmpinput.Adapter
	// VNC is QEMU's VNC unix socket (-vnc unix:PATH,share=force-shared);
	// VNCOwner the uid that must own it and QEMU (nil: effective uid).
	VNC      string
	VNCOwner *uint32
	Tokens   *token.Store
	Auditor  *Auditor
	// Origins are the exact origins browsers load the page from
	// ("http://127.0.0.1:8443"); requests from anything else are refused.
	Origins []string
	// MaxHold bounds one takeover (default DefaultMaxHold, at most
	// qmpinput.MaxHandoverTTL); a hold never outlives its token.
	MaxHold time.Duration
	// Name is the desktop name the viewer shows (default "tether").
	Name string
	// RefreshEvery is each screen's refresh nudge period (see
	// rfb.Session.RefreshEvery); zero means rfb.DefaultRefreshEvery,
	// negative turns it off (for measurements only).
	RefreshEvery time.Duration
	// PauseOwner, if set, names who alone pauses and resumes the VM
	// (e.g. "tether-computer"): a viewer's pause or resume is refused
	// (ErrForbidden) and Server.Pause and Server.Resume are the only
	// way, so the view never contradicts the VM's owner about whether
	// the VM runs.
	PauseOwner string
	Now        func() time.Time
	Logf       func(format string, args ...any)
}

// Server serves one VM's live view. Close must be called: it closes
// every viewer and ends any hold; it does not close the Adapter.
type Server struct {
	cfg      Config
	owner    uint32
	origins  map[string]bool
	hosts    map[string]bool
	sessions sessions
	ar       *arbiter

	mu      sync.Mutex
	viewers map[string]*viewer
	closed  bool

	stop      chan struct{}
	wg        sync.WaitGroup
	records   sync.WaitGroup // viewer_close records being appended (closeViewer)
	closeOnce sync.Once
}

// New checks cfg and returns a Server; Handler serves it.
func New(cfg Config) (*Server, error) {
	if cfg.Adapter == nil || cfg.VNC == "" || cfg.Tokens == nil || cfg.Auditor == nil || len(cfg.Origins) == 0 {
		return nil, fmt.Errorf("%w: view needs an adapter, a VNC socket, a token store, an auditor and origins", qmpinput.ErrConfig)
	}
	setDefaults(&cfg)
	if cfg.MaxHold <= 0 || cfg.MaxHold > qmpinput.MaxHandoverTTL {
		return nil, fmt.Errorf("%w: max hold %v outside (0, %v]", qmpinput.ErrConfig, cfg.MaxHold, qmpinput.MaxHandoverTTL)
	}
	s := &Server{cfg: cfg, origins: map[string]bool{}, hosts: map[string]bool{}, viewers: map[string]*viewer{}, stop: make(chan struct{})}
	s.owner = uint32(os.Geteuid())
	if cfg.VNCOwner != nil {
		s.owner = *cfg.VNCOwner
	}
	for _, o := range cfg.Origins {
		n, err := ParseOrigin(o)
		if err != nil {
			return nil, err
		}
		u, _ := url.Parse(n)
		s.origins[n], s.hosts[u.Host] = true, true
	}
	s.ar = &arbiter{adapter: cfg.Adapter, aud: cfg.Auditor, maxHold: cfg.MaxHold, now: cfg.Now, changed: s.broadcast, logf: cfg.Logf,
		pauseOwner: cfg.PauseOwner}
	s.wg.Add(1)
	go s.sweep()
	return s, nil
}

func setDefaults(c *Config) {
	if c.MaxHold == 0 {
		c.MaxHold = DefaultMaxHold
	}
	if c.Name == "" {
		c.Name = "tether"
	}
	if c.RefreshEvery == 0 {
		c.RefreshEvery = rfb.DefaultRefreshEvery
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logf == nil {
		c.Logf = log.Printf
	}
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/api/session", s.exchange)
	mux.HandleFunc("/ws/control", s.control)
	mux.HandleFunc("/ws/rfb", s.rfb)
	mux.Handle("/", s.static())
	return securityHeaders(mux)
}

// Serve serves HTTP on l until ctx ends, then closes the server.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case err := <-errc:
		s.Close()
		return err
	case <-ctx.Done():
	}
	s.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close closes every viewer (ending any hold as disconnected), stops
// the token sweep and waits until every viewer_close is appended, so the
// caller may close the audit log after it. Safe twice.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.mu.Lock()
		s.closed = true
		vs := s.viewerList()
		s.mu.Unlock()
		for _, v := range vs {
			s.closeViewer(v, "server closing")
		}
		s.wg.Wait()
		s.records.Wait()
	})
}

func (s *Server) viewerList() []*viewer {
	out := make([]*viewer, 0, len(s.viewers))
	for _, v := range s.viewers {
		out = append(out, v)
	}
	return out
}

// sweep closes viewers whose token was revoked or expired, ending their
// hold (as revoked, or by its own TTL).
func (s *Server) sweep() {
	defer s.wg.Done()
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		vs := s.viewerList()
		s.mu.Unlock()
		for _, v := range vs {
			s.checkViewer(v)
		}
	}
}

func (s *Server) checkViewer(v *viewer) {
	tok, err := s.cfg.Tokens.Get(v.tokenID)
	if err == nil {
		err = tok.Live(s.cfg.Now())
	}
	if err == nil {
		return
	}
	s.sessions.drop(v.tokenID)
	if errors.Is(err, token.ErrRevoked) {
		s.ar.end(v, qmpinput.EndRevoked)
	}
	s.closeViewer(v, tokenCode(err))
}

// broadcast wakes every viewer's control writer to send the state.
func (s *Server) broadcast() {
	s.mu.Lock()
	vs := s.viewerList()
	s.mu.Unlock()
	for _, v := range vs {
		v.poke()
	}
}

// securityHeaders sets the headers every response carries.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "+
			"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		hd.Set("Cross-Origin-Resource-Policy", "same-origin")
		if strings.HasPrefix(r.URL.Path, "/api/") || strings.HasPrefix(r.URL.Path, "/ws/") {
			hd.Set("Cache-Control", "no-store")
		}
		h.ServeHTTP(w, r)
	})
}
