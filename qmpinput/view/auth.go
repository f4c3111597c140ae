package view

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/qmpinput/token"
)

// CookieName is the session cookie. The __Host- prefix makes the browser
// refuse it unless it is Secure, has Path=/ and no Domain.
const CookieName = "__Host-tether-view"

// Bounds.
const (
	maxSessions     = 1024
	maxExchangeBody = 1024
)

// Errors of the request checks; each names the check that refused.
var (
	// ErrOrigin: the Origin (or Sec-Fetch-Site, or Host) is not this
	// server's.
	ErrOrigin = errors.New("request origin refused")
	// ErrNoSession: no valid session cookie.
	ErrNoSession = errors.New("no valid session")
)

// session is what a cookie stands for: one exchanged token.
type session struct {
	tokenID string
	role    token.Role
	actor   string
	expires time.Time
}

// sessions maps the SHA-256 of a cookie value to its session; the cookie
// value itself is never stored.
type sessions struct {
	mu sync.Mutex
	m  map[[32]byte]session
}

func (s *sessions) add(sess session) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	v := base64.RawURLEncoding.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[[32]byte]session{}
	}
	if len(s.m) >= maxSessions {
		s.pruneLocked(sess.expires.Add(-token.MaxTTL))
		if len(s.m) >= maxSessions {
			return "", fmt.Errorf("%d sessions open", len(s.m))
		}
	}
	s.m[sha256.Sum256([]byte(v))] = sess
	return v, nil
}

func (s *sessions) get(cookie string) (session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[sha256.Sum256([]byte(cookie))]
	return sess, ok
}

// drop removes every session of a token.
func (s *sessions) drop(tokenID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.m {
		if v.tokenID == tokenID {
			delete(s.m, k)
		}
	}
}

func (s *sessions) pruneLocked(before time.Time) {
	for k, v := range s.m {
		if v.expires.Before(before) {
			delete(s.m, k)
		}
	}
}

// checkOrigin refuses a request whose Host is not one of the allowed
// origins' hosts (DNS rebinding), whose Origin (required when needOrigin)
// is not exactly an allowed origin, or whose Sec-Fetch-Site says another
// site sent it.
func (s *Server) checkOrigin(r *http.Request, needOrigin bool) error {
	if !s.hosts[strings.ToLower(r.Host)] {
		return fmt.Errorf("%w: host %q", ErrOrigin, r.Host)
	}
	o := r.Header.Get("Origin")
	if o == "" && needOrigin {
		return fmt.Errorf("%w: no Origin header", ErrOrigin)
	}
	if o != "" && !s.origins[strings.ToLower(o)] {
		return fmt.Errorf("%w: origin %q", ErrOrigin, o)
	}
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return nil
	default:
		return fmt.Errorf("%w: Sec-Fetch-Site %q", ErrOrigin, r.Header.Get("Sec-Fetch-Site"))
	}
}

// authorize checks the Origin, the cookie and its token (known, live),
// and returns the session. Every API and WebSocket request goes through
// it.
func (s *Server) authorize(r *http.Request) (session, error) {
	if err := s.checkOrigin(r, true); err != nil {
		return session{}, err
	}
	c, err := r.Cookie(CookieName)
	if err != nil {
		return session{}, fmt.Errorf("%w: no cookie", ErrNoSession)
	}
	sess, ok := s.sessions.get(c.Value)
	if !ok {
		return session{}, fmt.Errorf("%w: unknown cookie", ErrNoSession)
	}
	tok, err := s.cfg.Tokens.Get(sess.tokenID)
	if err != nil {
		return session{}, err
	}
	if err := tok.Live(s.cfg.Now()); err != nil {
		s.sessions.drop(sess.tokenID)
		return session{}, err
	}
	if tok.Role != sess.role {
		return session{}, fmt.Errorf("%w: token role changed", ErrNoSession)
	}
	return sess, nil
}

// exchange turns a one-time link's secret into a session cookie.
func (s *Server) exchange(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		refuse(w, http.StatusMethodNotAllowed, "method", errors.New("POST only"))
		return
	}
	if err := s.checkOrigin(r, true); err != nil {
		refuse(w, http.StatusForbidden, "origin", err)
		return
	}
	var body struct {
		Token string `json:"token"`
	}
	if err := decodeBody(r, &body); err != nil {
		refuse(w, http.StatusBadRequest, "request", err)
		return
	}
	tok, err := s.cfg.Tokens.Exchange(token.Secret(body.Token))
	if err != nil {
		refuse(w, http.StatusForbidden, tokenCode(err), err)
		return
	}
	sess := session{tokenID: tok.ID, role: tok.Role, actor: tok.Actor(), expires: tok.Expires}
	v, err := s.sessions.add(sess)
	if err != nil {
		refuse(w, http.StatusServiceUnavailable, "sessions", err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: v, Path: "/", Expires: tok.Expires,
		MaxAge: int(time.Until(tok.Expires).Seconds()) + 1, Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	writeJSON(w, http.StatusOK, map[string]any{"role": tok.Role, "actor": sess.actor, "expires": tok.Expires})
}

func decodeBody(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return fmt.Errorf("content type %q, want application/json", ct)
	}
	return strictjson.Read(r.Body, maxExchangeBody, v)
}

func tokenCode(err error) string {
	for _, c := range []struct {
		err  error
		code string
	}{{token.ErrUsed, "token_used"}, {token.ErrExpired, "token_expired"}, {token.ErrRevoked, "token_revoked"},
		{token.ErrMalformed, "token_malformed"}, {token.ErrUnknown, "token_unknown"}, {ErrOrigin, "origin"},
		{ErrNoSession, "no_session"}, {ErrForbidden, "forbidden"}} {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "error"
}

func refuse(w http.ResponseWriter, status int, code string, err error) {
	writeJSON(w, status, map[string]any{"ok": false, "code": code, "error": err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
