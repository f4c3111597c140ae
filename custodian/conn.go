package custodian

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/binding"
	"github.com/tetherdev/tether/custodian/longline"
)

// ConnOptions tune one served ACP connection.
type ConnOptions struct {
	// OnUpdate receives the agent's session/update notifications, in the
	// order the agent sent them. Nil discards them.
	OnUpdate func(ctx context.Context, n acp.SessionNotification) error
	// Permission answers session/request_permission. Nil picks the first
	// reject option offered (or cancels): the custodian grants nothing on
	// its own (PermissionPolicy builds one from a policy name). Every
	// answer is recorded in the audit log.
	Permission func(ctx context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error)
}

// Conn is one ACP connection to an agent, served by a Custodian: the agent
// is the ACP agent, the custodian its client. Every fs/* and terminal/*
// callback goes through the connection's binding table. The caller owns
// the two streams; closing them ends the connection. Close must be called.
type Conn struct {
	c     *Custodian
	acp   *acp.ClientSideConnection
	table *binding.Table
	opts  ConnOptions

	mu      sync.Mutex
	watches map[*Receiver]func()
	// unboundPerms folds the permission requests of sessions not bound
	// on this connection.
	unboundPerms *auditFold
	endOnce      sync.Once     // endAll
	stop         chan struct{} // closed by Close: the end watcher returns
	ended        sync.WaitGroup
}

// client is the acp.Client a Conn serves.
type client struct {
	c    *Custodian
	conn *Conn
}

var (
	_ acp.Client                 = (*client)(nil)
	_ acp.ExtensionMethodHandler = (*client)(nil)
)

// lineServer serves a client's long agent messages (longline.Server).
type lineServer struct{ cl *client }

var _ longline.Server = lineServer{}

// WriteTextFile serves a long write as the SDK serves a short one.
func (s lineServer) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return s.cl.WriteTextFile(ctx, p)
}

// WriteTextFileContent serves a long write whose content is decoded from
// its line as it is sent.
func (s lineServer) WriteTextFileContent(ctx context.Context, p acp.WriteTextFileRequest, c *longline.Content) (acp.WriteTextFileResponse, error) {
	return s.cl.writeTextFile(ctx, p, writeContent{long: c})
}

// ReadTextFile serves a read whose answer the long-line reader writes
// itself, as the SDK serves one; a long content comes in a spool file.
func (s lineServer) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, *longline.FileContent, error) {
	return s.cl.readTextFile(ctx, p)
}

// Refused counts a refused long message in the connection's refusals
// (no session id: the session of a message not decoded is not known).
func (s lineServer) Refused(code errcode.Code, method string) {
	s.cl.conn.table.Refused(nil, code, audit.RefusalEvent{Method: method})
}

// Decoded runs the test hook's "long-line-decoded" step.
func (s lineServer) Decoded(method string) {
	if s.cl.c.hook != nil {
		s.cl.c.hook(context.Background(), method, "long-line-decoded")
	}
}

// Serve starts serving an ACP connection: toAgent is the agent's input
// (its stdin), fromAgent its output (its stdout).
func (c *Custodian) Serve(toAgent io.Writer, fromAgent io.Reader, opts ConnOptions) *Conn {
	cn := &Conn{c: c, table: c.keeper.NewTable(), opts: opts, watches: map[*Receiver]func(){},
		unboundPerms: c.newFold(audit.Record{Method: acp.ClientMethodSessionRequestPermission}),
		stop:         make(chan struct{})}
	// The SDK starts reading inside its constructor; the gate holds that
	// first read until its logger is set, so SetLogger cannot race with it.
	out := longline.NewLockedWriter(toAgent)
	cl := &client{c: c, conn: cn}
	g := &gatedReader{r: longline.NewReader(fromAgent, out, lineServer{cl}, c.log, c.lines), open: make(chan struct{})}
	cn.acp = acp.NewClientSideConnection(cl, out, g)
	cn.acp.SetLogger(sdkLogger(c.log))
	close(g.open)
	cn.ended.Go(func() { // the agent's side ending ends every session
		select {
		case <-cn.acp.Done():
			cn.endAll()
		case <-cn.stop:
		}
	})
	return cn
}

// Agent returns the SDK connection, for agent methods this type does not
// wrap (authenticate, set mode, cancel, ...).
func (cn *Conn) Agent() *acp.ClientSideConnection { return cn.acp }

// Done is closed when the agent's side of the connection ends.
func (cn *Conn) Done() <-chan struct{} { return cn.acp.Done() }

// Initialize announces the fs and terminal capabilities. They only make
// the agent send callbacks; nothing is dispatched for a session unless it
// is bound and attached.
func (cn *Conn) Initialize(ctx context.Context) (acp.InitializeResponse, error) {
	return cn.acp.Initialize(ctx, acp.InitializeRequest{
		ProtocolVersion: acp.ProtocolVersionNumber,
		ClientCapabilities: acp.ClientCapabilities{
			Fs:       acp.FileSystemCapabilities{ReadTextFile: true, WriteTextFile: true},
			Terminal: true,
		},
		ClientInfo: &acp.Implementation{Name: "tether-custodian", Version: Version},
	})
}

// NewSession sends session/new carrying `_meta["tether/bind"]` for b. The
// binding waits for the agent's `_tether/attach` before anything runs
// (binding.Table.New).
func (cn *Conn) NewSession(ctx context.Context, req acp.NewSessionRequest, b Binding) (acp.NewSessionResponse, error) {
	meta, err := cn.bindMeta(req.Meta, b)
	if err != nil {
		return acp.NewSessionResponse{}, err
	}
	req.Meta = meta
	var resp acp.NewSessionResponse
	err = cn.table.New(ctx, b.spec(), cn.local(b), func(ctx context.Context) (string, error) {
		var err error
		resp, err = cn.acp.NewSession(ctx, req)
		return string(resp.SessionId), err
	})
	return resp, err
}

// LoadSession sends session/load carrying `_meta["tether/bind"]` for b. A
// session already bound on this connection must name the same tuple (only
// a later lease is taken) and must reattach (binding.Table.Load).
func (cn *Conn) LoadSession(ctx context.Context, req acp.LoadSessionRequest, b Binding) (acp.LoadSessionResponse, error) {
	meta, err := cn.bindMeta(req.Meta, b)
	if err != nil {
		return acp.LoadSessionResponse{}, err
	}
	req.Meta = meta
	var resp acp.LoadSessionResponse
	err = cn.table.Load(ctx, string(req.SessionId), b.spec(), cn.local(b), func(ctx context.Context) error {
		var err error
		resp, err = cn.acp.LoadSession(ctx, req)
		return err
	})
	return resp, err
}

// bindMeta validates b and adds its bind entry to meta.
func (cn *Conn) bindMeta(meta map[string]any, b Binding) (map[string]any, error) {
	if err := b.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBind, err)
	}
	if _, ok := meta[acpmeta.KeyBind]; ok {
		return nil, fmt.Errorf("%w: the request already carries %s", ErrBind, acpmeta.KeyBind)
	}
	return acpmeta.MergeMeta(meta, acpmeta.Bind{Tuple: b.Tuple, LeaseNotAfter: b.LeaseNotAfter.UTC()}.Meta()), nil
}

// Binding is what a session is bound to: the immutable tuple, the lease,
// the receiver it runs on and the principal it acts for.
type Binding struct {
	Tuple         admission.Tuple
	LeaseNotAfter time.Time
	Principal     string
	Receiver      *Receiver
	// Plain says the agent knows nothing of tether (docs/custodian.md
	// "Plain agents"): the custodian attaches the session itself once the
	// agent answered session/new or session/load, and again after a
	// transport loss; it tags a callback that carries no
	// `_meta["tether/op"]` itself (the binding's digest, a fresh op key,
	// min(command budget, lease) as the deadline), recording
	// tagged_by "custodian". A present but wrong tag still fences, and a
	// callback naming another session is still refused.
	Plain bool
}

// validate refuses a binding the custodian could not enforce.
func (b Binding) validate() error {
	switch {
	case b.Receiver == nil:
		return fmt.Errorf("%w: binding has no receiver", ErrConfig)
	case b.Principal == "":
		return fmt.Errorf("%w: binding has no principal", ErrConfig)
	case b.Principal != b.Tuple.Owner:
		return fmt.Errorf("%w: principal %q is not the tuple's owner %q", ErrConfig, b.Principal, b.Tuple.Owner)
	case b.LeaseNotAfter.IsZero():
		return fmt.Errorf("%w: binding has no lease_not_after", ErrConfig)
	}
	return b.Tuple.Validate()
}

// spec is what the binding package decides on of b.
func (b Binding) spec() binding.Spec {
	return binding.Spec{Tuple: b.Tuple, LeaseNotAfter: b.LeaseNotAfter, Principal: b.Principal, Plain: b.Plain}
}

// local returns the maker of the custodian's side of a row bound as b on
// cn.
func (cn *Conn) local(b Binding) func(*binding.Session) any {
	return func(s *binding.Session) any {
		return &session{Session: s, Receiver: b.Receiver, conn: cn, terminals: map[string]*terminal{}}
	}
}

// ExtendLease applies a same-tuple lease extension to a bound session
// (binding.Table.ExtendLease): the later lease end is first recorded
// durably in the operation-key store, so the keys the session already
// dispatched are kept until it ends plus the retention; if that record
// fails, the lease is not extended.
func (cn *Conn) ExtendLease(ctx context.Context, sessionID string, notAfter time.Time) error {
	return cn.table.ExtendLease(ctx, sessionID, notAfter)
}

// Prompt sends session/prompt.
func (cn *Conn) Prompt(ctx context.Context, req acp.PromptRequest) (acp.PromptResponse, error) {
	return cn.acp.Prompt(ctx, req)
}

// watch fences every binding of this connection attached on a receiver
// connection when that connection is lost.
func (cn *Conn) watch(r *Receiver) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if _, ok := cn.watches[r]; ok {
		return
	}
	cn.watches[r] = r.Watch(func(epoch uint64, cause error) {
		for _, s := range cn.table.All() {
			if sessionOf(s).Receiver == r {
				cn.c.keeper.FenceEpoch(s, epoch, cause.Error())
			}
		}
	})
}

// Close ends every session of the connection (CloseSession, without
// session/close: their terminals are released, refusals written, bindings
// forgotten) and stops watching receivers for it. The caller closes the
// streams it passed to Serve. Safe to call twice.
func (cn *Conn) Close() error {
	cn.endAll()
	cn.mu.Lock()
	defer cn.mu.Unlock()
	select {
	case <-cn.stop:
	default:
		close(cn.stop)
	}
	cn.ended.Wait()
	for r, cancel := range cn.watches {
		cancel()
		delete(cn.watches, r)
	}
	return nil
}

// SessionUpdate hands a session/update to OnUpdate.
func (h *client) SessionUpdate(ctx context.Context, n acp.SessionNotification) error {
	if h.conn.opts.OnUpdate == nil {
		return nil
	}
	return h.conn.opts.OnUpdate(ctx, n)
}
