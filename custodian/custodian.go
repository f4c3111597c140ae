// Package custodian is the ACP client side of tether: it serves the fs/*
// and terminal/* callbacks of an ACP agent by sending them to the receiver
// inside the one computer a session is bound to, never to the host.
//
// An orchestrator embeds it:
//
//	c, err := custodian.New(custodian.Options{StateDir: dir, AuditKey: skey})
//	defer c.Close()
//	r := custodian.NewReceiver(dialer, custodian.Backoff{}, nil)
//	defer r.Close()
//	conn := c.Serve(agentStdin, agentStdout, custodian.ConnOptions{OnUpdate: print})
//	defer conn.Close()
//	conn.Initialize(ctx)
//	sess, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: tuple.Root, McpServers: []acp.McpServer{}},
//		custodian.Binding{Tuple: tuple, LeaseNotAfter: lease, Principal: tuple.Owner, Receiver: r})
//	conn.Prompt(ctx, acp.PromptRequest{SessionId: sess.SessionId, Prompt: ...})
//
// Every state-changing callback is keyed by its operation key in a durable
// store (custodian/opstore) and every decision is appended to a signed
// transparency log (custodian/audit).
package custodian

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/binding"
	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/internal/durable"
	"github.com/tetherdev/tether/custodian/longline"
	"github.com/tetherdev/tether/custodian/opstore"
)

// Version is reported to agents in clientInfo.
const Version = "0.1.0"

// Sub-directories of the state directory.
const (
	OpKeysDir = "opkeys"
	AuditDir  = "audit"
)

// Defaults of Options.LongLines and Options.LongLineBytes.
const (
	DefaultLongLines     = longline.DefaultLines
	DefaultLongLineBytes = longline.DefaultBytes
)

// Options configure a Custodian.
type Options struct {
	// StateDir holds the operation-key store (opkeys/) and the audit log
	// (audit/). It is created 0700; an existing one must be owned by this
	// user and not writable by group or others.
	StateDir string
	// AuditKey is the note signing key (PRIVATE+KEY+name+hash+key) of the
	// audit checkpoints. LoadAuditKey reads it from a checked file.
	AuditKey []byte
	// Retention is how long operation keys are kept past the later of
	// their dispatch and their lease's end. Zero means 24 h (the minimum).
	Retention time.Duration
	// CommandBudget caps every callback's deadline. Zero means 10 min.
	CommandBudget time.Duration
	// AttachTimeout bounds `_tether/attach`, including waiting for the
	// receiver connection. Zero means 15 s.
	AttachTimeout time.Duration
	// CheckpointEvery is the period of signed audit checkpoints. Zero
	// means 30 s. A checkpoint is also written at Close.
	CheckpointEvery time.Duration
	// RefusalBudget is how many refusals one session may cause before it
	// is fenced for good (no attach lifts it). Zero means
	// DefaultRefusalBudget; negative means no budget.
	RefusalBudget int
	// RefusalRecordEvery bounds how often one session's refusals record
	// is written. Zero means DefaultRefusalRecordEvery.
	RefusalRecordEvery time.Duration
	// AuditBudget is how many permission records, and how many attach
	// records, one session writes one by one in each RefusalRecordEvery;
	// the rest are folded into one record (auditfold.go). Zero means
	// DefaultAuditBudget; negative means no budget (a record each).
	AuditBudget int
	// LongLines caps how many agent messages longer than acp-go-sdk's
	// 10 MiB line bound the custodian takes in at once, across every
	// connection (package longline); one past it is answered busy. Zero means
	// DefaultLongLines; negative turns the long-line caps off (this and
	// LongLineBytes), and such a line is held in memory as it is read.
	LongLines int
	// LongLineBytes caps the memory charged to long messages across
	// them: each is charged twice its length while it is served, and one
	// longer than half of it (or than 384 MiB) is answered too_large.
	// Zero means DefaultLongLineBytes.
	LongLineBytes int64
	// Fleet, if set, keeps operation keys, receipts, session bindings and
	// session ownership in etcd instead of the state directory's bbolt
	// store (docs/operations.md): every session is claimed at bind, its
	// requests carry the fencing token, and another custodian sharing the
	// store may take a session over (TakeOver). The audit log stays in
	// StateDir. The caller opens it (OpenFleet) and closes it after
	// Close; closing it revokes the ownership lease.
	Fleet *opstore.EtcdStore
	// StoreWait bounds how long a bind (NewSession, LoadSession) and a
	// claim of the session in the fleet's op store (also the agent's
	// attach) wait out an op store answering unavailable (an etcd member
	// restarting, a leader election, quorum lost for a while) before
	// they give up: only their op-store steps are repeated, each safe to
	// repeat (storewait.go). Each retry is logged at Warn. Zero means no
	// waiting: the first unavailable answer fails.
	StoreWait time.Duration
	// Witness, if set, sends each checkpoint the audit log signs to
	// these witnesses in the background (audit.Submitter, the exchange
	// of `tether-custodian audit witness`), keeping the cosignatures in
	// audit/checkpoint.cosigned; nothing waits for them. Its Logger nil
	// means Logger. Close submits the final checkpoint, waiting at most
	// its CloseTimeout, and stops it.
	Witness *audit.SubmitOptions
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Defaults of the refusal options (custodian/binding decides on them).
const (
	DefaultRefusalBudget      = binding.DefaultRefusalBudget
	DefaultRefusalRecordEvery = binding.DefaultRefusalRecordEvery
)

// TaggedByCustodian is the tagged_by of receipts and audit records of a
// plain agent's callback whose op tag the custodian minted.
const TaggedByCustodian = binding.TaggedByCustodian

// newKey returns a fresh operation key with a prefix.
var newKey = binding.NewKey

// Custodian holds what every connection shares: the operation-key store
// and the audit log of one state directory. Close must be called.
type Custodian struct {
	opts  Options
	log   *slog.Logger
	store opstore.Keys       // the bbolt Store, or Options.Fleet
	fleet *opstore.EtcdStore // Options.Fleet, or nil
	alog  *audit.Log
	wit   *audit.Submitter // Options.Witness, or nil

	// taken holds what TakeOver claimed, by session id, until the
	// session is bound (fleet.go).
	takenMu sync.Mutex
	taken   map[string]opstore.Claimed

	// keeper decides on every binding of every connection: admission,
	// refusals, fences, attach (custodian/binding).
	keeper *binding.Keeper

	tallyMu sync.Mutex
	folds   map[*auditFold]struct{} // permission and attach records not written yet (auditfold.go)
	lines   *longline.Caps          // long agent lines; nil: no caps
	// hook, set only by tests, is called at the named steps of a call
	// (the crash test SIGKILLs the process there; others cancel the
	// agent's request there).
	hook func(ctx context.Context, method, step string)
}

// New opens the state directory: it recovers the operation-key store
// (keys dispatched before a crash become interrupted) and opens the audit
// log, refusing one that does not match its own signed checkpoint.
func New(opts Options) (*Custodian, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	signer, verifier, err := audit.LoadSigner(opts.AuditKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := ensureStateDir(opts.StateDir); err != nil {
		return nil, err
	}
	store, err := openStore(opts)
	if err != nil {
		return nil, err
	}
	aopts := audit.Options{Signer: signer, Verifier: verifier, CheckpointEvery: opts.CheckpointEvery, Now: opts.Now}
	wit, err := startWitnessing(opts, verifier, &aopts)
	var alog *audit.Log
	if err == nil {
		alog, err = audit.Open(filepath.Join(opts.StateDir, AuditDir), aopts)
	}
	if err != nil {
		if wit != nil {
			wit.Close()
		}
		if opts.Fleet == nil {
			store.Close()
		}
		return nil, err
	}
	c := &Custodian{opts: opts, log: opts.Logger, store: store, fleet: opts.Fleet, alog: alog, wit: wit,
		taken: map[string]opstore.Claimed{}, folds: map[*auditFold]struct{}{}, lines: longline.NewCaps(opts.StateDir, opts.LongLines, opts.LongLineBytes)}
	c.keeper = binding.NewKeeper(binding.Config{CommandBudget: opts.CommandBudget, AttachTimeout: opts.AttachTimeout,
		RefusalBudget: opts.RefusalBudget, RefusalRecordEvery: opts.RefusalRecordEvery},
		binding.Hooks{Now: opts.Now, Audit: c.audit, AuditErr: c.auditErr, KeepForLease: c.keepForLeaseWaiting, Claim: c.claim,
			AskReceiver: c.askReceiver, Attached: c.attached})
	return c, nil
}

// openStore returns the fleet's etcd store, or opens the state
// directory's bbolt store.
func openStore(opts Options) (opstore.Keys, error) {
	if opts.Fleet != nil {
		return opts.Fleet, nil
	}
	return opstore.Open(filepath.Join(opts.StateDir, OpKeysDir), opstore.Options{Retention: opts.Retention, Now: opts.Now})
}

func (o *Options) fill() error {
	if o.StateDir == "" {
		return fmt.Errorf("%w: state directory is required", ErrConfig)
	}
	if o.Retention != 0 && o.Retention < opstore.MinRetention {
		return fmt.Errorf("%w: retention %s is below the minimum %s", ErrConfig, o.Retention, opstore.MinRetention)
	}
	if o.CommandBudget <= 0 {
		o.CommandBudget = 10 * time.Minute
	}
	if o.AttachTimeout <= 0 {
		o.AttachTimeout = 15 * time.Second
	}
	if o.RefusalBudget == 0 {
		o.RefusalBudget = binding.DefaultRefusalBudget
	}
	if o.RefusalRecordEvery <= 0 {
		o.RefusalRecordEvery = binding.DefaultRefusalRecordEvery
	}
	if o.AuditBudget == 0 {
		o.AuditBudget = DefaultAuditBudget
	}
	if o.LongLines == 0 {
		o.LongLines = DefaultLongLines
	}
	if o.LongLineBytes <= 0 {
		o.LongLineBytes = DefaultLongLineBytes
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

func ensureStateDir(dir string) error {
	if err := durable.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("custodian: create state directory: %w", err)
	}
	return credfile.CheckPrivateDir(dir)
}

func (c *Custodian) now() time.Time { return c.opts.Now() }

// Checkpoint makes the audit log durable and writes a signed checkpoint,
// which it returns (keep a copy elsewhere to check consistency later).
// The refusals counted so far are written first.
func (c *Custodian) Checkpoint() ([]byte, error) {
	c.flushRefusals()
	return c.alog.Checkpoint(context.Background())
}

// Close flushes receipts, writes the final audit checkpoint and releases
// the state directory. Connections should be closed first. A fleet store
// (Options.Fleet) is left open: its caller closes it. With witnesses
// (Options.Witness), Close then sends them the final checkpoint, waiting
// at most their CloseTimeout, and stops the submitter; witnesses that do
// not answer are logged, never an error of Close.
func (c *Custodian) Close() error {
	c.flushRefusals()
	var serr error
	if c.fleet == nil {
		serr = c.store.Close()
	}
	aerr := c.alog.Close()
	if c.wit != nil {
		c.wit.Close()
	}
	return errors.Join(serr, aerr)
}
