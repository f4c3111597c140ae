package custodian

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/binding"
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

// Serve starts serving an ACP connection: toAgent is the agent's input
// (its stdin), fromAgent its output (its stdout).
func (c *Custodian) Serve(toAgent io.Writer, fromAgent io.Reader, opts ConnOptions) *Conn {
	cn := &Conn{c: c, table: c.keeper.NewTable(), opts: opts, watches: map[*Receiver]func(){},
		unboundPerms: c.newFold(audit.Record{Method: acp.ClientMethodSessionRequestPermission}),
		stop:         make(chan struct{})}
	// The SDK starts reading inside its constructor; the gate holds that
	// first read until its logger is set, so SetLogger cannot race with it.
	out := &lockedWriter{w: toAgent}
	cl := &client{c: c, conn: cn}
	g := &gatedReader{r: splitLongLines(fromAgent, out, cl, c.log, c.lines), open: make(chan struct{})}
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
// binding waits for the agent's `_tether/attach` before anything runs.
func (cn *Conn) NewSession(ctx context.Context, req acp.NewSessionRequest, b Binding) (acp.NewSessionResponse, error) {
	meta, err := cn.bindMeta(req.Meta, b)
	if err != nil {
		return acp.NewSessionResponse{}, err
	}
	req.Meta = meta
	p := cn.table.AddPending(b.spec(), cn.local(b))
	resp, err := cn.acp.NewSession(ctx, req)
	row, cerr := cn.table.ConfirmNew(p, string(resp.SessionId), err != nil)
	if err != nil {
		return resp, err
	}
	if cerr != nil {
		return resp, cerr
	}
	bnd := sessionOf(row)
	cn.auditBind(bnd)
	// Only the claim waits out an unavailable op store: session/new is
	// not repeated (the agent would make another session).
	if err := cn.c.claim(ctx, bnd.Session); err != nil {
		return resp, fmt.Errorf("%w: session %s: %w", ErrBind, bnd.ID(), err)
	}
	return resp, cn.attachPlain(ctx, bnd)
}

// attachPlain attaches a plain agent's freshly bound session before
// anything else is sent to the agent (its first prompt); a tether agent
// attaches by itself. A failure leaves the session awaiting attach and is
// returned, naming the check.
func (cn *Conn) attachPlain(ctx context.Context, b *session) error {
	if !b.Plain {
		return nil
	}
	if err := cn.table.SelfAttach(ctx, b.Session); err != nil {
		return fmt.Errorf("%w: the custodian's attach for plain session %s: %w", ErrBind, b.ID(), err)
	}
	return nil
}

// LoadSession sends session/load carrying `_meta["tether/bind"]` for b. A
// session already bound on this connection must name the same tuple (only
// a later lease is taken) and must reattach.
func (cn *Conn) LoadSession(ctx context.Context, req acp.LoadSessionRequest, b Binding) (acp.LoadSessionResponse, error) {
	meta, err := cn.bindMeta(req.Meta, b)
	if err != nil {
		return acp.LoadSessionResponse{}, err
	}
	req.Meta = meta
	// A load of a session already bound may extend its lease: the keys it
	// dispatched are kept for the lease as extended, recorded first. The
	// record only ever lengthens the recorded lease (a compare-and-swap),
	// so it is safe to repeat while the op store is unavailable.
	digest := b.Tuple.SHA256()
	if err := cn.c.waitStore(ctx, cn.c.opts.StoreWait, "record the lease of tuple "+digest, func(ctx context.Context) error {
		return cn.c.keepForLease(ctx, digest, b.LeaseNotAfter)
	}); err != nil {
		return acp.LoadSessionResponse{}, err
	}
	row, created, err := cn.table.AddLoad(string(req.SessionId), b.spec(), cn.local(b))
	if err != nil {
		return acp.LoadSessionResponse{}, err
	}
	bnd := sessionOf(row)
	// The claim (and its waiting) comes before session/load reaches the
	// agent, which is sent once.
	if err := cn.c.claim(ctx, bnd.Session); err != nil { // a session another custodian owns is not loaded
		if created {
			cn.table.Remove(string(req.SessionId), row)
		}
		return acp.LoadSessionResponse{}, fmt.Errorf("%w: session %s: %w", ErrBind, req.SessionId, err)
	}
	resp, err := cn.acp.LoadSession(ctx, req)
	if err != nil {
		if created {
			cn.table.Remove(string(req.SessionId), row)
		}
		return resp, err
	}
	cn.auditBind(bnd)
	return resp, cn.attachPlain(ctx, bnd)
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

func (cn *Conn) auditBind(b *session) {
	lease := b.Lease()
	cn.c.audit(audit.Record{Kind: audit.KindBind, SessionID: b.ID(), TupleSHA256: b.Digest,
		Principal: b.Principal, LeaseNotAfter: &lease})
}

// ExtendLease applies a same-tuple lease extension to a bound session.
// The later lease end is first recorded durably in the operation-key
// store, so the keys the session already dispatched are kept until it
// ends plus the retention; if that record fails, the lease is not
// extended.
func (cn *Conn) ExtendLease(ctx context.Context, sessionID string, notAfter time.Time) error {
	b := cn.table.Get(sessionID)
	if b == nil {
		return fmt.Errorf("%w: session %q is not bound", ErrBind, sessionID)
	}
	if err := cn.c.keepForLease(ctx, b.Digest, notAfter); err != nil {
		return err
	}
	if err := b.Extend(notAfter); err != nil {
		return err
	}
	na := notAfter.UTC()
	cn.c.audit(audit.Record{Kind: audit.KindLease, SessionID: sessionID, TupleSHA256: b.Digest,
		Principal: b.Principal, LeaseNotAfter: &na})
	return nil
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
