// Package acptest is a real ACP client (acp-go-sdk, client side) for tests:
// it serves fs/* from a directory and terminal/* with real processes, and it
// checks `_meta["tether/op"]` on every callback the way the custodian does:
// a missing or malformed tag, or a digest that is not the session's bound
// tuple, is refused with tether code tuple_mismatch and nothing is done. It
// also answers `_tether/attach` and honours `_meta["tether/expect"]`.
// It records every callback so tests can assert what the plugin sent.
package acptest

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
)

// Call is one recorded callback.
type Call struct {
	Method    string
	SessionID string
	Path      string // fs calls
	Op        acpmeta.Op
	OpErr     error // why the op tag was refused, if it was
	Expect    *acpmeta.Expect
	Verify    *acpmeta.Verify // terminal/create's tether/verify, if any
	Raw       map[string]any  // the request's _meta
}

// AttachFunc answers `_tether/attach`.
type AttachFunc func(ctx context.Context, req acpmeta.AttachRequest) (acpmeta.AttachResponse, error)

// Client is the test ACP client. Set Root before use; Bind tells it which
// tuple digest each session's requests must carry.
type Client struct {
	// Root is the absolute directory served; ACP paths must lie below it.
	Root string
	// Attach answers `_tether/attach`; nil refuses with not_admitted.
	Attach AttachFunc
	// AfterRead, if set, runs after each successful fs/read_text_file
	// (tests use it to race a concurrent writer).
	AfterRead func(path string)
	// OnTerminal, if set, runs before each terminal/* callback is served.
	OnTerminal func(method string)
	// OnWait, if set, runs when terminal/wait_for_exit is served, with the
	// request's context, before the wait. A test that cancels the tool
	// call there can block until ctx ends (the caller's $/cancel_request
	// arrived), so the wait is surely in flight when the cancellation
	// lands, however fast the command; a wait whose ctx has ended then
	// answers cancelled, never the exit.
	OnWait func(ctx context.Context)

	mu        sync.Mutex
	bound     map[string]string // session id -> tuple_sha256
	calls     []Call
	updates   []acp.SessionNotification
	terminals map[string]*terminal
	nextTerm  int
}

var (
	_ acp.Client                 = &Client{}
	_ acp.ExtensionMethodHandler = &Client{}
)

// Bind makes sessionID's requests require tupleSHA256.
func (c *Client) Bind(sessionID, tupleSHA256 string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bound == nil {
		c.bound = make(map[string]string)
	}
	c.bound[sessionID] = tupleSHA256
}

// Calls returns a copy of every recorded callback.
func (c *Client) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Call(nil), c.calls...)
}

// Reset forgets the recorded callbacks.
func (c *Client) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = nil
}

// check records the callback and enforces the op tag: the custodian's
// first check on every fs/* and terminal/* request.
func (c *Client) check(method string, sid acp.SessionId, path string, meta map[string]any) (Call, error) {
	call := Call{Method: method, SessionID: string(sid), Path: path, Raw: meta}
	op, err := acpmeta.OpFromMeta(meta)
	call.Op, call.OpErr = op, err
	if e, ok, eerr := acpmeta.ExpectFromMeta(meta); ok && eerr == nil {
		call.Expect = &e
	} else if eerr != nil && err == nil {
		err = eerr
	}
	if v, ok, verr := acpmeta.VerifyFromMeta(meta); ok && verr == nil {
		call.Verify = &v
	} else if verr != nil && err == nil {
		err = verr
	}
	c.mu.Lock()
	want, bound := c.bound[string(sid)]
	c.calls = append(c.calls, call)
	c.mu.Unlock()
	switch {
	case !bound:
		return call, acperr.NewError(errcode.CodeNotAdmitted, "session %s is not bound", sid)
	case err != nil:
		return call, acperr.NewError(errcode.CodeTupleMismatch, "%s: %v", method, err)
	case op.TupleSHA256 != want:
		return call, acperr.NewError(errcode.CodeTupleMismatch, "%s: tuple_sha256 %s is not the binding's %s", method, op.TupleSHA256, want)
	case !op.Deadline.After(time.Now()):
		return call, acperr.NewError(errcode.CodeTimeout, "%s: deadline %s has passed", method, op.Deadline)
	}
	return call, nil
}

// local maps an ACP absolute path into Root.
func (c *Client) local(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("path %q is not absolute", p)
	}
	clean := filepath.Clean(p)
	if clean != c.Root && !strings.HasPrefix(clean, c.Root+string(filepath.Separator)) {
		return "", fmt.Errorf("path %q is outside the root", p)
	}
	return clean, nil
}

// HandleExtensionMethod answers `_tether/attach`; any other extension
// method is unexpected.
func (c *Client) HandleExtensionMethod(ctx context.Context, method string, params json.RawMessage) (any, error) {
	if method != acpmeta.MethodAttach {
		return nil, acp.NewMethodNotFound(method)
	}
	var req acpmeta.AttachRequest
	if err := json.Unmarshal(params, &req); err != nil {
		return nil, acp.NewInvalidParams(map[string]any{"error": err.Error()})
	}
	c.mu.Lock()
	c.calls = append(c.calls, Call{Method: method, SessionID: req.SessionID})
	attach := c.Attach
	c.mu.Unlock()
	if attach == nil {
		return nil, acperr.NewError(errcode.CodeNotAdmitted, "no grant covers tuple %s", req.TupleSHA256)
	}
	resp, err := attach(ctx, req)
	if err != nil {
		return nil, err
	}
	c.Bind(req.SessionID, req.TupleSHA256)
	return resp, nil
}

// RequestPermission is never expected from the plugin.
func (c *Client) RequestPermission(ctx context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return acp.RequestPermissionResponse{}, acp.NewMethodNotFound("session/request_permission (unexpected)")
}

// SessionUpdate records agent updates (the host agent sends them).
func (c *Client) SessionUpdate(ctx context.Context, n acp.SessionNotification) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.updates = append(c.updates, n)
	return nil
}

// Updates returns a copy of every session/update received.
func (c *Client) Updates() []acp.SessionNotification {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]acp.SessionNotification(nil), c.updates...)
}
