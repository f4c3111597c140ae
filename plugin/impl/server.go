// Package impl is tether-plugin's implementation of shared.Plugin: it keeps
// the ACP connections the host hands over, the binding table
// (plugin/binding) and runs the tools (plugin/tools) in bound sessions. Main
// serves it over go-plugin.
package impl

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/plugin/binding"
	pb "github.com/tetherdev/tether/plugin/proto"
	"github.com/tetherdev/tether/plugin/shared"
	"github.com/tetherdev/tether/receiver/wire"
)

// Timeouts of a tool call and of `_tether/attach`.
const (
	DefaultToolTimeout = 60 * time.Second
	MaxToolTimeout     = time.Hour
	AttachTimeout      = 30 * time.Second
)

// Server implements shared.Plugin. The zero value is not usable; call New.
type Server struct {
	table *binding.Table
	now   func() time.Time

	mu    sync.Mutex
	conns map[string]*conn
}

var _ shared.Plugin = &Server{}

// conn is one ACP connection the host handed over.
type conn struct {
	id        string
	principal string
	client    shared.ACPClient
}

// New returns a Server reading time from now (time.Now if nil).
func New(now func() time.Time) *Server {
	if now == nil {
		now = time.Now
	}
	return &Server{table: binding.New(now), now: now, conns: make(map[string]*conn)}
}

func randomID(prefix string) (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return prefix + hex.EncodeToString(b[:]), nil
}

// Connect implements shared.Plugin. The principal is the host's
// authenticated identity for the connection; an empty one is refused.
func (s *Server) Connect(ctx context.Context, client shared.ACPClient, principal string) (string, error) {
	if principal == "" {
		return "", wire.Errorf(wire.CodeDenied, "connect: the host authenticated no principal")
	}
	id, err := randomID("conn-")
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns[id] = &conn{id: id, principal: principal, client: client}
	return id, nil
}

// Disconnect implements shared.Plugin: bindings on the connection fence,
// and the connection's client is closed.
func (s *Server) Disconnect(ctx context.Context, connID string) error {
	s.mu.Lock()
	c, ok := s.conns[connID]
	delete(s.conns, connID)
	s.mu.Unlock()
	s.table.Disconnect(connID)
	if !ok {
		return wire.Errorf(wire.CodeInvalid, "disconnect: unknown connection %q", connID)
	}
	if cl, ok := c.client.(io.Closer); ok {
		_ = cl.Close()
	}
	return nil
}

func (s *Server) conn(id string) (*conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.conns[id]
	if !ok {
		return nil, wire.Errorf(wire.CodeInvalid, "unknown connection %q (closed or never connected)", id)
	}
	return c, nil
}

// OpenSession implements shared.Plugin.
func (s *Server) OpenSession(ctx context.Context, req *pb.OpenSessionRequest) (*pb.SessionStatus, error) {
	c, err := s.conn(req.GetConnId())
	if err != nil {
		return nil, err
	}
	var method binding.Method
	switch req.GetMethod() {
	case pb.SessionMethod_SESSION_METHOD_NEW:
		method = binding.MethodNew
	case pb.SessionMethod_SESSION_METHOD_LOAD:
		method = binding.MethodLoad
	default:
		return nil, wire.Errorf(wire.CodeInvalid, "open session: method must be new or load")
	}
	meta, err := shared.MetaFromJSON(req.GetMetaJson())
	if err != nil {
		return nil, wire.Errorf(wire.CodeInvalid, "open session: %v", err)
	}
	st, err := s.table.Open(ctx, binding.OpenRequest{ConnID: c.id, SessionID: req.GetSessionId(),
		Principal: c.principal, Method: method, Meta: meta, Attach: attachFunc(c)})
	if err != nil {
		return nil, err
	}
	return statusPB(st), nil
}

// attachFunc calls `_tether/attach` on c and decodes the result strictly.
// A refusal comes back as a *wire.Error with the client's tether code (or
// not_admitted when it named none) and the client's own message.
func attachFunc(c *conn) binding.AttachFunc {
	return func(ctx context.Context, sid, sha string) (time.Time, uint64, error) {
		ctx, cancel := context.WithTimeout(ctx, AttachTimeout)
		defer cancel()
		raw, err := c.client.Attach(ctx, acpmeta.AttachRequest{SessionID: sid, TupleSHA256: sha})
		if err != nil {
			return time.Time{}, 0, attachRefusal(err)
		}
		var resp acpmeta.AttachResponse
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&resp); err != nil {
			return time.Time{}, 0, wire.Errorf(wire.CodeNotAdmitted, "_tether/attach result malformed: %v", err)
		}
		return resp.LeaseNotAfter, resp.GrantGeneration, nil
	}
}

// attachRefusal names why `_tether/attach` failed: the client's code and
// message, the lost connection (fate_unknown), or the attach timeout.
func attachRefusal(err error) *wire.Error {
	code, ok := acpmeta.CodeOf(err)
	switch {
	case ok:
	case errors.Is(err, shared.ErrTransport):
		code = wire.CodeFateUnknown
	case errors.Is(err, context.DeadlineExceeded):
		return wire.Errorf(wire.CodeTimeout, "no answer within %v", AttachTimeout)
	default:
		code = wire.CodeNotAdmitted
	}
	return &wire.Error{Code: code, Message: shared.PeerMessage(err)}
}

// Status implements shared.Plugin. Only the principal that opened the
// session may read its state.
func (s *Server) Status(ctx context.Context, req *pb.StatusRequest) (*pb.SessionStatus, error) {
	c, err := s.conn(req.GetConnId())
	if err != nil {
		return nil, err
	}
	st, err := s.table.Status(c.principal, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	return statusPB(st), nil
}

// ToolPolicy implements shared.Plugin. A refusal is an answer
// (allow=false with its code), not an error.
func (s *Server) ToolPolicy(ctx context.Context, req *pb.ToolPolicyRequest) (*pb.ToolPolicyResponse, error) {
	kind := map[pb.HostToolKind]binding.HostToolKind{
		pb.HostToolKind_HOST_TOOL_KIND_FILESYSTEM: binding.HostFilesystem,
		pb.HostToolKind_HOST_TOOL_KIND_PROCESS:    binding.HostProcess,
		pb.HostToolKind_HOST_TOOL_KIND_OTHER:      binding.HostOther,
	}[req.GetKind()]
	err := s.table.Policy(req.GetConnId(), req.GetSessionId(), kind)
	if err == nil {
		return &pb.ToolPolicyResponse{Allow: true}, nil
	}
	var we *wire.Error
	if !errors.As(err, &we) {
		return nil, err
	}
	return &pb.ToolPolicyResponse{Allow: false, Code: string(we.Code),
		Message: fmt.Sprintf("host tool %q: %s", req.GetTool(), we.Message)}, nil
}

func statusPB(st binding.Status) *pb.SessionStatus {
	out := &pb.SessionStatus{SessionId: st.SessionID, TupleSha256: st.TupleSHA256,
		GrantGeneration: st.GrantGeneration, Code: string(st.Code), Message: st.Message}
	out.State = map[binding.State]pb.BindingState{
		binding.Unbound: pb.BindingState_BINDING_STATE_UNBOUND,
		binding.Pending: pb.BindingState_BINDING_STATE_PENDING,
		binding.Bound:   pb.BindingState_BINDING_STATE_BOUND,
		binding.Fenced:  pb.BindingState_BINDING_STATE_FENCED,
	}[st.State]
	if !st.LeaseNotAfter.IsZero() {
		out.LeaseNotAfter = st.LeaseNotAfter.UTC().Format(time.RFC3339Nano)
	}
	return out
}
