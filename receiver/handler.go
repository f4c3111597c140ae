// Package receiver is the daemon inside the computer: a wireserver.Handler that
// resolves the grant of every request at request time through an
// admission.GrantSource, performs file operations beneath the grant root
// (receiver/fsops) and runs children as the grant's user (receiver/spawn).
// Run starts the whole daemon from a Config: capability checks, admission,
// listeners.
package receiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// Options configure a Handler.
type Options struct {
	// Grants answers every request's grant lookup; required. The daemon
	// uses an signedfile.Refresher.
	Grants admission.GrantSource
	// Limits cap what any grant may ask for; zero fields take the
	// DefaultLimits values.
	Limits Limits
	// Landlock confines children; the zero value (LandlockOff) does not.
	Landlock LandlockConfig
	// Cgroup contains each command in its own cgroup; the zero value
	// (CgroupOff) does not. With CgroupRequired NewHandler checks and
	// locks the parent, and fails naming the check that failed.
	Cgroup CgroupConfig
	// Seccomp runs every child under spawn's seccomp filter; the zero
	// value (SeccompOff) does not. Required with a required cgroup needs
	// SpawnMode spawn.ModeClone or spawn.ModeHelper.
	Seccomp SeccompConfig
	// SpawnMode selects how children are restricted (spawn.ModeThread by
	// default; spawn.ModeClone needs spawn.CloneSupported). HelperPath is
	// the binary ModeHelper re-executes.
	SpawnMode  spawn.Mode
	HelperPath string
	// RecheckEvery is how often the grants of running commands are looked
	// up again; a command whose grant is gone, expired or no longer allows
	// exec is killed. 0 means DefaultRecheckEvery.
	RecheckEvery time.Duration
	// ChildEnv is the default environment of every command (a grant's env
	// and a request's env are merged over it, HOME defaulting to the grant
	// root); nil means DefaultChildEnv, an empty map none.
	ChildEnv map[string]string
	// FenceState is the file that keeps the highest fencing token per
	// tuple across restarts (docs/protocol.md "Fencing"). Empty keeps
	// none: a request that carries a token is then refused (denied).
	FenceState string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives failures the peer sees only as a code; nil discards.
	Log *slog.Logger
}

// Handler serves every op of receiver/wire. Create it with NewHandler and
// release it with Close, which kills every child it started. It is safe
// for concurrent use.
type Handler struct {
	grants   admission.GrantSource
	limits   Limits
	landlock *landlockRules // nil when Landlock is off
	seccomp  *spawn.Filter  // nil when seccomp is off
	cgroups  *cgroups       // nil when cgroup containment is off
	cgv1     *cgroupsV1     // nil without cgroup v1 hierarchies
	enforced enforcement    // where the computer's limits are read
	childEnv map[string]string
	mode     spawn.Mode
	helper   string
	now      func() time.Time
	log      *slog.Logger

	terms     *terminals
	transfers *transfers
	fences    *fences

	closeOnce sync.Once
	closed    chan struct{}
	sweeper   sync.WaitGroup
}

// DefaultRecheckEvery is how often running commands' grants are checked.
const DefaultRecheckEvery = 5 * time.Second

var _ wireserver.Handler = (*Handler)(nil)

// ErrOptions wraps every refusal of NewHandler.
var ErrOptions = errors.New("receiver options")

// NewHandler validates opts and returns a Handler. With Landlock required
// it fails when the kernel cannot enforce it.
func NewHandler(opts Options) (*Handler, error) {
	if opts.Grants == nil {
		return nil, fmt.Errorf("%w: a GrantSource is required", ErrOptions)
	}
	lim, err := opts.Limits.withDefaults()
	if err != nil {
		return nil, err
	}
	h := &Handler{grants: opts.Grants, limits: lim, mode: opts.SpawnMode, helper: opts.HelperPath,
		now: opts.Now, log: opts.Log, closed: make(chan struct{})}
	if h.now == nil {
		h.now = time.Now
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.mode != spawn.ModeThread && h.mode != spawn.ModeHelper && h.mode != spawn.ModeClone {
		return nil, fmt.Errorf("%w: unknown spawn mode %d", ErrOptions, h.mode)
	}
	if h.mode == spawn.ModeClone {
		if err := spawn.CloneSupported(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrOptions, err)
		}
	}
	if h.childEnv = maps.Clone(opts.ChildEnv); h.childEnv == nil {
		h.childEnv = maps.Clone(DefaultChildEnv)
	}
	if err := validateChildEnv(h.childEnv); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	if h.fences, err = openFences(opts.FenceState); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	if h.seccomp, err = newSeccompFilter(opts.Seccomp, h.mode, opts.Cgroup); err != nil {
		return nil, err
	}
	if h.landlock, err = newLandlockRules(opts.Landlock); err != nil {
		return nil, err
	}
	if h.cgroups, err = newCgroups(opts.Cgroup, h.log); err != nil {
		h.landlock.close()
		return nil, err
	}
	if h.cgv1, err = openCgroupsV1(opts.Cgroup.V1); err != nil {
		h.cgroups.close()
		h.landlock.close()
		return nil, err
	}
	h.enforced = newEnforcement(opts.Cgroup)
	h.transfers = newTransfers()
	h.terms = newTerminals(lim.MaxTerminals)
	h.terms.bound(lim.MaxTerminalsPerTuple, lim.orphanGrace(), h.log)
	every := opts.RecheckEvery
	if every <= 0 {
		every = DefaultRecheckEvery
	}
	h.sweeper.Go(func() { h.sweep(every) })
	return h, nil
}

// Close kills every child the handler started, waits until each is reaped,
// its output drained and its cgroup removed, releases the cgroup parent,
// and refuses every later request with
// unavailable. It is safe to call twice.
func (h *Handler) Close() error {
	h.closeOnce.Do(func() {
		close(h.closed)
		h.sweeper.Wait()
		h.terms.closeAll()
		h.transfers.closeAll()
		h.landlock.close()
		h.cgroups.close()
		h.cgv1.close()
	})
	return nil
}

// Serve answers one request: envelope checks, argument decoding, the grant
// at request time, then the op. Every refusal is a *errcode.Error whose code
// names the failed check; nothing happens before the grant allows it.
func (h *Handler) Serve(ctx context.Context, req *wire.Request) (any, error) {
	select {
	case <-h.closed:
		return nil, errcode.Errorf(errcode.CodeUnavailable, "receiver is shutting down")
	default:
	}
	if err := checkEnvelope(req, h.now()); err != nil {
		return nil, err
	}
	args, err := decodeArgs(req)
	if err != nil {
		return nil, err
	}
	if req.Op == wire.OpAttach {
		res, err := h.attach(ctx, req.TupleSHA256)
		if err != nil {
			return nil, err
		}
		return res, h.fence(req)
	}
	g, err := h.grant(ctx, req.TupleSHA256, grantOp[req.Op])
	if err != nil {
		return nil, err
	}
	if err := h.fence(req); err != nil {
		return nil, err
	}
	res, err := h.dispatch(ctx, req, args, g)
	if err != nil {
		return nil, h.toWire(req.Op, err)
	}
	return res, nil
}

// grantOp maps each receiver op onto the grant op it needs.
var grantOp = map[wire.Op]admission.Op{
	wire.OpRead: admission.OpRead, wire.OpStat: admission.OpRead, wire.OpHash: admission.OpRead,
	wire.OpWrite: admission.OpWrite, wire.OpList: admission.OpList,
	wire.OpExecStart: admission.OpExec, wire.OpExecOutput: admission.OpExec,
	wire.OpExecWait: admission.OpExec, wire.OpExecRelease: admission.OpExec,
	wire.OpExecKill:  admission.OpKill,
	wire.OpReadChunk: admission.OpRead, wire.OpWriteBegin: admission.OpWrite, wire.OpWriteChunk: admission.OpWrite,
	wire.OpWriteCommit: admission.OpWrite, wire.OpWriteAbort: admission.OpWrite,
}

func (h *Handler) dispatch(ctx context.Context, req *wire.Request, args any, g admission.Grant) (any, error) {
	switch a := args.(type) {
	case *wire.ReadArgs:
		return h.read(g, a)
	case *wire.WriteArgs:
		return h.write(g, a)
	case *wire.StatArgs:
		return h.stat(g, a)
	case *wire.ListArgs:
		return h.list(g, a)
	case *wire.HashArgs:
		return h.hash(g, a)
	case *wire.ExecStartArgs:
		return h.execStart(ctx, req, a, g)
	case *wire.TerminalArgs:
		return h.terminalOp(ctx, req, a)
	case *wire.ReadChunkArgs:
		return h.readChunk(g, a)
	case *wire.WriteBeginArgs:
		return h.writeBegin(ctx, req, g, a)
	case *wire.WriteChunkArgs:
		return h.writeChunk(req, a)
	case *wire.TransferArgs:
		return h.writeEnd(req, g, a)
	}
	return nil, errcode.Errorf(errcode.CodeInvalid, "op %s has no handler", req.Op)
}

// fence admits the request's fencing token for its tuple (fence.go): a
// lower token than the tuple's highest is refused as fenced. A request
// that raises the highest token kills the commands still running under
// a lower one: their custodian has lost the session, and the new owner
// has recorded them interrupted.
func (h *Handler) fence(req *wire.Request) error {
	raised, err := h.fences.admit(req.TupleSHA256, req.Fence)
	if err != nil {
		return err
	}
	if raised {
		if n := h.terms.killBelow(req.TupleSHA256, req.Fence); n > 0 {
			h.log.Warn("receiver: fencing token raised; killed the commands of the earlier owner",
				"tuple", req.TupleSHA256, "token", req.Fence, "killed", n)
		}
	}
	return nil
}

// checkEnvelope checks what every request carries before anything else.
func checkEnvelope(req *wire.Request, now time.Time) error {
	switch {
	case !req.Op.Valid():
		return errcode.Errorf(errcode.CodeInvalid, "op %q is not in the closed set", req.Op)
	case !wire.ValidDigest(req.TupleSHA256):
		return errcode.Errorf(errcode.CodeInvalid, "tuple_sha256 is not 64 lowercase hex digits")
	case !wire.ValidOpKey(req.OpKey):
		return errcode.Errorf(errcode.CodeInvalid, "op_key is not 1..128 characters of [A-Za-z0-9._:-]")
	case req.Deadline.IsZero():
		return errcode.Errorf(errcode.CodeInvalid, "deadline missing")
	case !now.Before(req.Deadline):
		return errcode.Errorf(errcode.CodeTimeout, "request deadline %s has passed", req.Deadline.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// logInternal records an unexpected failure; the peer sees only internal.
func (h *Handler) logInternal(op wire.Op, err error) error {
	h.log.Error("receiver: op failed", "op", op, "err", err)
	return errcode.Errorf(errcode.CodeInternal, "%s failed inside the receiver", op)
}

// sweep re-resolves the grant of every running command each interval and
// kills the command when the grant no longer admits it: revocation reaches
// a running command within one interval, not only at its deadline. Any
// lookup failure kills, as any failure refuses a request.
func (h *Handler) sweep(every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-h.closed:
			return
		case <-tick.C:
		}
		for _, t := range h.terms.running() {
			ctx, cancel := context.WithTimeout(context.Background(), every)
			_, err := h.grant(ctx, t.tuple, admission.OpExec)
			cancel()
			if err != nil {
				h.log.Warn("receiver: grant gone; killing command", "terminal", t.id, "err", err)
				t.kill()
			}
		}
	}
}
