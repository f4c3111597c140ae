// Package server is tether-plugin's implementation of contract.Plugin: it keeps
// the principals of the host's ACP connections and the binding table
// (plugin/binding), decides every tool call (Authorize returns its plan,
// built by plugin/toolplan) and applies what the host reports back (fences,
// the check after glob and grep). Main serves it over go-plugin.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/plugin/binding"
	"github.com/tetherdev/tether/plugin/contract"
)

// Timeouts of a tool call.
const (
	DefaultToolTimeout = 60 * time.Second
	MaxToolTimeout     = time.Hour
)

// Server implements contract.Plugin. The zero value is not usable; call New.
type Server struct {
	table   *binding.Table
	tickets *ticketer
	now     func() time.Time

	mu    sync.Mutex
	conns map[string]string // connection id -> principal
}

var _ contract.Plugin = &Server{}

// New returns a Server reading time from now (time.Now if nil).
func New(now func() time.Time) *Server {
	if now == nil {
		now = time.Now
	}
	return &Server{table: binding.New(now), tickets: newTicketer(now), now: now, conns: make(map[string]string)}
}

func randomID(prefix string) (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return prefix + hex.EncodeToString(b[:]), nil
}

// Connect implements contract.Plugin. The principal is the host's
// authenticated identity for the connection; an empty one is refused.
func (s *Server) Connect(ctx context.Context, principal string) (string, error) {
	if principal == "" {
		return "", errcode.Errorf(errcode.CodeDenied, "connect: the host authenticated no principal")
	}
	id, err := randomID("conn-")
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns[id] = principal
	return id, nil
}

// Disconnect implements contract.Plugin: bindings on the connection fence.
func (s *Server) Disconnect(ctx context.Context, connID string) error {
	s.mu.Lock()
	_, ok := s.conns[connID]
	delete(s.conns, connID)
	s.mu.Unlock()
	s.table.Disconnect(connID)
	if !ok {
		return errcode.Errorf(errcode.CodeInvalid, "disconnect: unknown connection %q", connID)
	}
	return nil
}

// principal returns the principal of a connection still open.
func (s *Server) principal(connID string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.conns[connID]
	if !ok {
		return "", errcode.Errorf(errcode.CodeInvalid, "unknown connection %q (closed or never connected)", connID)
	}
	return p, nil
}

// OpenSession implements contract.Plugin.
func (s *Server) OpenSession(ctx context.Context, req contract.OpenRequest, attach contract.Attacher) (contract.Status, error) {
	principal, err := s.principal(req.ConnID)
	if err != nil {
		return contract.Status{}, err
	}
	return s.table.Open(ctx, binding.OpenRequest{ConnID: req.ConnID, SessionID: req.SessionID,
		Principal: principal, Method: req.Method, Meta: req.Meta, Attach: attachFunc(attach)})
}

// attachFunc calls `_tether/attach` through the host and decodes the
// result strictly. A refusal comes back as a *errcode.Error with the client's
// tether code (or not_admitted when it named none) and the client's own
// message.
func attachFunc(attach contract.Attacher) binding.AttachFunc {
	return func(ctx context.Context, sid, sha string) (time.Time, uint64, error) {
		ctx, cancel := context.WithTimeout(ctx, contract.AttachTimeout)
		defer cancel()
		raw, err := attach(ctx, sid, sha)
		if err != nil {
			return time.Time{}, 0, attachRefusal(err)
		}
		var resp acpmeta.AttachResponse
		if err := strictjson.Decode(raw, acpmeta.MaxValueBytes, &resp); err != nil {
			return time.Time{}, 0, errcode.Errorf(errcode.CodeNotAdmitted, "_tether/attach result malformed: %v", err)
		}
		return resp.LeaseNotAfter, resp.GrantGeneration, nil
	}
}

// attachRefusal names why `_tether/attach` failed: the client's code and
// message, the lost connection (fate_unknown), or the attach timeout.
func attachRefusal(err error) *errcode.Error {
	code, ok := acperr.CodeOf(err)
	switch {
	case ok:
	case errors.Is(err, contract.ErrTransport):
		code = errcode.CodeFateUnknown
	case errors.Is(err, context.DeadlineExceeded):
		return errcode.Errorf(errcode.CodeTimeout, "no answer within %v", contract.AttachTimeout)
	default:
		code = errcode.CodeNotAdmitted
	}
	return &errcode.Error{Code: code, Message: contract.PeerMessage(err)}
}

// Status implements contract.Plugin. Only the principal that opened the
// session may read its state.
func (s *Server) Status(ctx context.Context, connID, sessionID string) (contract.Status, error) {
	principal, err := s.principal(connID)
	if err != nil {
		return contract.Status{}, err
	}
	return s.table.Status(principal, sessionID)
}

// ToolPolicy implements contract.Plugin: a refusal names the tool.
func (s *Server) ToolPolicy(ctx context.Context, connID, sessionID, tool string, kind contract.HostToolKind) error {
	err := s.table.Policy(connID, sessionID, kind)
	var we *errcode.Error
	if errors.As(err, &we) {
		return &errcode.Error{Code: we.Code, Message: fmt.Sprintf("host tool %q: %s", tool, we.Message)}
	}
	return err
}
