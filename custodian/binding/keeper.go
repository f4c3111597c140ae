// Package binding owns the life of a custodian's session bindings: the
// table of one ACP connection, bind, attach (the agent's and, for a plain
// agent, the custodian's own), the decision to admit, refuse or fence
// each fs/* and terminal/* callback, the refusal codes and their tallies,
// and the end of a session. Every binding check's refusal and every fence
// is decided here, each with its errcode code; the custodian's handlers
// call Table.Admit once per callback and act on the Call it returns. The
// checks of a request's own content (its path, arguments, terminal id)
// stay with the handlers, which count their refusals here (Call.Refuse).
//
// It does not import the custodian: what stays there (the audit log, the
// clock, the durable lease record and the claim in the op store, the
// receiver's attach op) comes in as Hooks.
package binding

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/receiver/wire"
)

// Defaults of the refusal options.
const (
	DefaultRefusalBudget      = 1000
	DefaultRefusalRecordEvery = 5 * time.Second
)

// TaggedByCustodian is the tagged_by of receipts and audit records of a
// plain agent's callback whose op tag the custodian minted.
const TaggedByCustodian = "custodian"

// Config is what the decisions are bounded by; zero values are not
// defaulted here (the custodian's Options are).
type Config struct {
	// CommandBudget caps every callback's deadline.
	CommandBudget time.Duration
	// AttachTimeout bounds the receiver's answer to an attach.
	AttachTimeout time.Duration
	// RefusalBudget is how many refusals one session may cause before it
	// is fenced for good; negative means no budget.
	RefusalBudget int
	// RefusalRecordEvery bounds how often one session's refusals record
	// is written.
	RefusalRecordEvery time.Duration
}

// Hooks are what the decisions need of the custodian. Every field is
// required.
type Hooks struct {
	// Now returns the current time.
	Now func() time.Time
	// Audit appends a record; a failure is the custodian's to log.
	Audit func(audit.Record)
	// AuditErr refuses (unavailable) when the audit log cannot record.
	AuditErr func() error
	// KeepForLease records, durably and before a binding takes it, that
	// the op keys of tuple digest are kept for a lease ending at notAfter
	// (only ever lengthening what is recorded, so safe to repeat); with
	// wait it waits out an unavailable op store.
	KeepForLease func(ctx context.Context, digest string, notAfter time.Time, wait bool) error
	// Claim makes this custodian the owner of s in the fleet's op store
	// (nil error without a fleet); its error carries an errcode code, or
	// is a refusal of ClaimRefusal.
	Claim func(ctx context.Context, s *Session) error
	// AskReceiver sends the attach op for s on the receiver's live
	// connection (waiting for one until ctx ends) and returns its answer
	// and the connection's epoch.
	AskReceiver func(ctx context.Context, s *Session) (wire.AttachResult, uint64, error)
	// Attached runs after a confirmed attach of s on epoch: the
	// custodian watches the receiver, records rec and reclaims the
	// session's terminals.
	Attached func(ctx context.Context, s *Session, epoch uint64, rec audit.Record)
}

// Keeper decides for every connection of one custodian. It holds the
// refusal tallies not written yet; Flush writes them.
type Keeper struct {
	cfg Config
	h   Hooks

	mu      sync.Mutex
	tallies map[*tally]struct{}
}

// NewKeeper returns a Keeper deciding under cfg with h.
func NewKeeper(cfg Config, h Hooks) *Keeper {
	return &Keeper{cfg: cfg, h: h, tallies: map[*tally]struct{}{}}
}

// NewKey returns a fresh operation key with a prefix.
func NewKey(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// auditFence records that s was fenced.
func (k *Keeper) auditFence(s *Session, code errcode.Code) {
	k.h.Audit(audit.Record{Kind: audit.KindFence, SessionID: s.ID, TupleSHA256: s.Digest,
		Principal: s.Principal, Code: string(code)})
}
