package view

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/rfb"
	"github.com/tetherdev/tether/qmpinput/token"
)

// Bounds.
const (
	maxViewers      = 64
	maxControlFrame = 1024
	opTimeout       = 15 * time.Second
)

// viewer is one open page: a control WebSocket (state, commands) and at
// most one RFB WebSocket (the screen and, while it holds input, the
// keyboard and pointer). Closing either closes both and ends its hold.
type viewer struct {
	id, tokenID, actor string
	role               token.Role
	expires            time.Time
	ctx                context.Context
	cancel             context.CancelCauseFunc
	pokeC              chan struct{}

	mu      sync.Mutex
	sess    *rfb.Session
	rfbUsed bool
}

func (v *viewer) poke() {
	select {
	case v.pokeC <- struct{}{}:
	default:
	}
}

// releaseInput lifts every key and button the viewer holds down. The
// arbiter calls it with its lock held, before the agent is unfenced.
func (v *viewer) releaseInput() {
	v.mu.Lock()
	sess := v.sess
	v.mu.Unlock()
	if sess != nil {
		sess.Release()
	}
}

// Stats returns the viewer's RFB counters, or nil before its screen opened.
func (v *viewer) stats() *rfb.Stats {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sess == nil {
		return nil
	}
	return v.sess.Stats()
}

func (s *Server) addViewer(sess session) (*viewer, error) {
	b := make([]byte, 8)
	rand.Read(b)
	ctx, cancel := context.WithCancelCause(context.Background())
	v := &viewer{id: hex.EncodeToString(b), tokenID: sess.tokenID, actor: sess.actor, role: sess.role,
		expires: sess.expires, ctx: ctx, cancel: cancel, pokeC: make(chan struct{}, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.viewers) >= maxViewers {
		cancel(nil)
		return nil, fmt.Errorf("%d viewers open or server closing", len(s.viewers))
	}
	// Recorded under s.mu, before the viewer is in the map: its
	// viewer_open precedes any viewer_close, and Close cannot miss it. A
	// viewer whose opening cannot be recorded is refused.
	if err := s.ar.aud.viewerOpened(v); err != nil {
		cancel(nil)
		return nil, fmt.Errorf("%w: the viewer's opening could not be recorded: %w", errAudit, err)
	}
	s.viewers[v.id] = v
	return v, nil
}

// errAudit marks a viewer refused because the audit log failed.
var errAudit = errors.New("audit")

// closeViewer ends v's hold (its held keys are lifted first) and closes
// both of its WebSockets. Safe twice.
func (s *Server) closeViewer(v *viewer, reason string) {
	s.mu.Lock()
	open := s.viewers[v.id] == v
	if open {
		delete(s.viewers, v.id)
		s.records.Add(1) // under s.mu, so Close waits for this record
	}
	s.mu.Unlock()
	s.ar.end(v, qmpinput.EndDisconnected)
	v.cancel(errors.New(reason))
	if open {
		if err := s.ar.aud.viewerClosed(v, reason); err != nil {
			s.ar.logf("view: audit: record viewer %s closed: %v", v.id, err)
		}
		s.records.Done()
	}
}

func (s *Server) acceptOptions() *websocket.AcceptOptions {
	var hosts []string
	for h := range s.hosts {
		hosts = append(hosts, h)
	}
	return &websocket.AcceptOptions{OriginPatterns: hosts}
}

// control serves a page's control WebSocket: hello, then the state on
// every change; commands take over, hand back, pause and resume.
func (s *Server) control(w http.ResponseWriter, r *http.Request) {
	sess, err := s.authorize(r)
	if err != nil {
		refuse(w, http.StatusForbidden, tokenCode(err), err)
		return
	}
	v, err := s.addViewer(sess)
	if errors.Is(err, errAudit) {
		refuse(w, http.StatusServiceUnavailable, "audit", err)
		return
	}
	if err != nil {
		refuse(w, http.StatusServiceUnavailable, "viewers", err)
		return
	}
	defer s.closeViewer(v, "control closed")
	c, err := websocket.Accept(w, r, s.acceptOptions())
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(maxControlFrame)
	out := make(chan any, 8)
	go func() {
		s.readControl(c, v, out)
		s.closeViewer(v, "control closed")
	}()
	s.writeControl(c, v, out)
}

type hello struct {
	Type    string     `json:"type"`
	Viewer  string     `json:"viewer"`
	Role    token.Role `json:"role"`
	Actor   string     `json:"actor"`
	Expires time.Time  `json:"expires"`
}

type stateMsg struct {
	Type string `json:"type"`
	State
}

type errorMsg struct {
	Type    string `json:"type"`
	Op      string `json:"op"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeControl is the only writer of c: hello, states, answers, and a
// closing note when the viewer is closed.
func (s *Server) writeControl(c *websocket.Conn, v *viewer, out <-chan any) {
	send := func(m any) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b, _ := json.Marshal(m)
		return c.Write(ctx, websocket.MessageText, b) == nil
	}
	if !send(hello{"hello", v.id, v.role, v.actor, v.expires}) || !send(stateMsg{"state", s.ar.state(v)}) {
		return
	}
	for {
		select {
		case <-v.pokeC:
			if !send(stateMsg{"state", s.ar.state(v)}) {
				return
			}
		case m := <-out:
			if !send(m) {
				return
			}
		case <-v.ctx.Done():
			reason := context.Cause(v.ctx).Error()
			send(map[string]string{"type": "closed", "reason": reason})
			c.Close(websocket.StatusPolicyViolation, reason)
			return
		}
	}
}

// readControl reads commands until the socket closes or a frame is
// malformed. Its reads carry no deadline of the viewer's: coder/websocket
// closes a connection whose read context ends, and the writer must be
// able to send the closing note first; writeControl's Close ends the read.
func (s *Server) readControl(c *websocket.Conn, v *viewer, out chan<- any) {
	for {
		typ, b, err := c.Read(context.Background())
		if err != nil || typ != websocket.MessageText {
			return
		}
		var cmd struct {
			Op string `json:"op"`
		}
		if err := strictjson.Decode(b, maxControlFrame, &cmd); err != nil {
			return
		}
		if err := s.do(v, cmd.Op); err != nil {
			select {
			case out <- errorMsg{"error", cmd.Op, opCode(err), err.Error()}:
			case <-v.ctx.Done():
				return
			}
		}
	}
}

// do runs one page command after checking the token is still live.
func (s *Server) do(v *viewer, op string) error {
	tok, err := s.cfg.Tokens.Get(v.tokenID)
	if err == nil {
		err = tok.Live(s.cfg.Now())
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(v.ctx, opTimeout)
	defer cancel()
	switch op {
	case "takeover":
		return s.ar.takeover(v)
	case "handback":
		return s.ar.handback(v)
	case "pause":
		return s.ar.pause(ctx, v)
	case "resume":
		return s.ar.resume(ctx, v)
	}
	return fmt.Errorf("%w: unknown operation %q", ErrForbidden, op)
}

func opCode(err error) string {
	switch {
	case errors.Is(err, ErrHeld), errors.Is(err, qmpinput.ErrHandoverActive):
		return "held"
	case errors.Is(err, ErrNotHolder):
		return "not_holder"
	case errors.Is(err, ErrAudit):
		return "audit"
	}
	if c := qmpinput.ErrorCode(err); c != "error" {
		return c
	}
	return tokenCode(err)
}

// rfb serves a viewer's screen: RFB over a binary WebSocket, proxied to
// a fresh pinned connection to QEMU's VNC socket.
func (s *Server) rfb(w http.ResponseWriter, r *http.Request) {
	sess, err := s.authorize(r)
	if err != nil {
		refuse(w, http.StatusForbidden, tokenCode(err), err)
		return
	}
	v, err := s.claimScreen(r.URL.Query().Get("viewer"), sess)
	if err != nil {
		refuse(w, http.StatusForbidden, "viewer", err)
		return
	}
	qemu, err := qmpinput.DialPinned(r.Context(), s.cfg.VNC, s.owner)
	if err != nil {
		s.closeViewer(v, "vnc socket refused")
		refuse(w, http.StatusBadGateway, qmpinput.ErrorCode(err), err)
		return
	}
	c, err := websocket.Accept(w, r, s.acceptOptions())
	if err != nil {
		qemu.Close()
		s.closeViewer(v, "websocket refused")
		return
	}
	nc := websocket.NetConn(v.ctx, c, websocket.MessageBinary)
	err = s.proxy(v, nc, qemu)
	c.Close(websocket.StatusPolicyViolation, closeReason(err))
	s.closeViewer(v, "screen closed: "+closeReason(err))
}

// proxy runs the handshake and the gating session until either side
// ends or the viewer is closed.
func (s *Server) proxy(v *viewer, nc, qemu net.Conn) error {
	defer qemu.Close()
	if _, err := rfb.Handshake(v.ctx, nc, qemu, s.cfg.Name); err != nil {
		return err
	}
	rs := rfb.NewSession(nc, qemu, gate{s.ar, v})
	rs.RefreshEvery = max(s.cfg.RefreshEvery, 0)
	v.mu.Lock()
	v.sess = rs
	v.mu.Unlock()
	return rs.Run(v.ctx)
}

func closeReason(err error) string {
	if errors.Is(err, rfb.ErrMalformed) {
		return "malformed rfb message"
	}
	if err == nil {
		return "closed"
	}
	return "ended"
}

// claimScreen finds the viewer id of the same token that has no screen
// yet.
func (s *Server) claimScreen(id string, sess session) (*viewer, error) {
	s.mu.Lock()
	v := s.viewers[id]
	s.mu.Unlock()
	if v == nil || v.tokenID != sess.tokenID {
		return nil, errors.New("no such viewer for this session")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.rfbUsed {
		return nil, errors.New("the viewer's screen is already open")
	}
	v.rfbUsed = true
	return v, nil
}
