package custodian

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/custodian/routine"
	"github.com/tetherdev/tether/receiver/wire"
)

// Routines (custodian/routine): a template saved from a verified exec
// receipt and submitted again, with a fresh op key, through the same
// custody path as the agent's own terminal/create. Nothing here runs on
// its own: no schedule, no standing permission, no background re-run.

// execRecord is what an exec's receipt keeps of its request, for a
// routine to be saved from it: nil for a plain agent's call (its key was
// minted by the custodian for that request alone, and a plain agent
// never asks for a verified outcome, so no routine could be saved from
// it) and for a request too large to keep (opstore.ExecRequest.Small).
func (cl *call) execRecord(args *wire.ExecStartArgs) *opstore.ExecRequest {
	e := &opstore.ExecRequest{Argv: args.Argv, Cwd: args.Cwd, Env: args.Env}
	if cl.TaggedBy == TaggedByCustodian || !e.Small() {
		return nil
	}
	return e
}

// Audit outcomes of KindRoutine records.
const (
	routineSaved = "saved"
	routineRun   = "run"
)

// SaveRoutine saves the routine name from the receipt of fromOpKey, for
// owner (the principal the caller acts for). The receipt must be an exec
// (terminal/create) that recorded what it ran, verified, and owner's
// (routine.FromReceipt names the failed check); an unknown op key is
// routine.ErrUnknownOpKey; an existing name is routine.ErrExists unless
// replace. The save is audited (KindRoutine, the template's digest, the
// source op key) before the template is written, so no template exists
// that the log does not name. It returns the template and its digest.
func (c *Custodian) SaveRoutine(name, fromOpKey, owner string, replace bool) (*routine.Template, string, error) {
	if err := routine.CheckName(name); err != nil {
		return nil, "", err
	}
	r, err := c.receiptOf(fromOpKey, owner)
	if err != nil {
		return nil, "", err
	}
	t, err := routine.FromReceipt(name, owner, r, c.now())
	if err != nil {
		return nil, "", err
	}
	st, err := routine.OpenStore(c.opts.StateDir)
	if err != nil {
		return nil, "", err
	}
	if _, err := st.Load(name); err == nil && !replace {
		return nil, "", fmt.Errorf("%w: %q (save with replace to overwrite it)", routine.ErrExists, name)
	}
	digest, err := t.Digest()
	if err != nil {
		return nil, "", err
	}
	rec := audit.Record{Kind: audit.KindRoutine, Principal: owner, OpKey: r.OpKey, RequestSHA256: r.RequestSHA256,
		SessionID: r.SessionID, TupleSHA256: r.TupleSHA256, Outcome: routineSaved, Digests: map[string]string{"template": digest}}
	if err := c.auditDispatch(rec); err != nil {
		return nil, "", err
	}
	if err := st.Save(t, replace); err != nil {
		return nil, "", err
	}
	return t, digest, nil
}

// receiptOf returns the receipt of opKey to save a routine from: owner's,
// when several sessions used the key. An op key owner used in more than
// one session is refused as ambiguous.
func (c *Custodian) receiptOf(opKey, owner string) (*opstore.Receipt, error) {
	if !acpmeta.ValidOpKey(opKey) {
		return nil, fmt.Errorf("%w: %q is not a well-formed op key", routine.ErrUnknownOpKey, opKey)
	}
	all, err := c.store.List()
	if err != nil {
		return nil, fmt.Errorf("routine: list receipts: %w", err)
	}
	var found, mine []*opstore.Receipt
	for _, r := range all {
		if r.OpKey != opKey {
			continue
		}
		found = append(found, r)
		if r.Principal == owner {
			mine = append(mine, r)
		}
	}
	switch {
	case len(found) == 0:
		return nil, fmt.Errorf("%w: no receipt has op key %q%s", routine.ErrUnknownOpKey, opKey, pluginKeyHint(all, opKey))
	case len(mine) == 0:
		return found[0], nil // FromReceipt refuses it: another owner's
	case len(mine) > 1:
		return nil, fmt.Errorf("routine: op key %q was used by %d sessions of %q (%s); save from a key used once",
			opKey, len(mine), owner, sessionsOf(mine))
	}
	return mine[0], nil
}

// pluginKeyHint names the exec receipt of a run_command the plugin sent
// under opKey: the plugin keys each terminal step as KEY:create, KEY:wait
// and so on, while the tool's answer shows the bare KEY. "" when there is
// no such receipt.
func pluginKeyHint(all []*opstore.Receipt, opKey string) string {
	create := opKey + ":create"
	for _, r := range all {
		if r.OpKey == create {
			return fmt.Sprintf(" (the exec receipt of the run_command with op_key %q is %q: save --from %s)", opKey, create, create)
		}
	}
	return ""
}

func sessionsOf(rs []*opstore.Receipt) string {
	ids := make([]string, 0, len(rs))
	for _, r := range rs {
		ids = append(ids, r.SessionID)
	}
	sort.Strings(ids)
	return strings.Join(ids, ", ")
}

// RunRoutine runs the routine name once on sessionID, bound on this
// connection, under opKey (fresh, given by the caller), and returns the
// exec's receipt. It is the agent's own path: terminal/create with the
// template's argv, cwd (beneath the session's current root), env and
// files to verify, admitted against the session's current binding (its
// tuple digest, its attach, its lease), keyed by opKey in the op key
// store; then wait_for_exit, which records the exit and the after-exit
// digests, and release. A retry of opKey with the same template is
// answered from its receipt and runs nothing; the same key for another
// request is op_key_conflict. A session that is not bound here is
// not_admitted; a routine of another owner than the session's principal
// is denied. Each run is audited (KindRoutine, the template's digest, the
// new op key) before anything is sent.
func (cn *Conn) RunRoutine(ctx context.Context, sessionID, name, opKey string) (*opstore.Receipt, error) {
	b, t, digest, err := cn.routineFor(sessionID, name, opKey)
	if err != nil {
		return nil, err
	}
	c := cn.c
	key := opstore.Key(b.Digest, b.ID, opKey)
	_, getErr := c.store.Get(key)
	replay := getErr == nil
	rec := audit.Record{Kind: audit.KindRoutine, SessionID: b.ID, TupleSHA256: b.Digest, Principal: b.Principal,
		OpKey: opKey, Outcome: routineRun, Digests: map[string]string{"template": digest}}
	if err := c.auditDispatch(rec); err != nil {
		return nil, err
	}
	h := &client{c: c, conn: cn}
	sid := acp.SessionId(sessionID)
	term, err := h.CreateTerminal(ctx, cn.routineRequest(b, t, opKey))
	if err != nil {
		return nil, err
	}
	if !replay {
		if err := cn.finishRoutine(ctx, h, b, sid, term.TerminalId, opKey); err != nil {
			return nil, err
		}
	}
	data, err := c.store.Get(key)
	if err != nil {
		return nil, fmt.Errorf("routine %q: read receipt: %w", name, err)
	}
	return opstore.Unmarshal(data)
}

// routineFor checks a run's arguments and loads the template: a valid op
// key, a session bound on cn, a template of the session's principal.
func (cn *Conn) routineFor(sessionID, name, opKey string) (*session, *routine.Template, string, error) {
	if !acpmeta.ValidOpKey(opKey) {
		return nil, nil, "", acperr.NewError(errcode.CodeInvalid, "op key %q is not well-formed", opKey)
	}
	row := cn.table.Get(sessionID)
	if row == nil {
		cn.table.Refused(nil, errcode.CodeNotAdmitted, audit.RefusalEvent{Method: routineMethod, OpKey: opKey})
		return nil, nil, "", acperr.NewError(errcode.CodeNotAdmitted, "session %q is not bound on this connection", sessionID)
	}
	st, err := routine.ReadStore(cn.c.opts.StateDir)
	if err != nil {
		return nil, nil, "", err
	}
	t, err := st.Load(name)
	if err != nil {
		return nil, nil, "", err
	}
	b := sessionOf(row)
	if t.Owner != b.Principal {
		cn.table.Refused(row, errcode.CodeDenied, audit.RefusalEvent{Method: routineMethod, OpKey: opKey})
		return nil, nil, "", acperr.NewError(errcode.CodeDenied, "routine %q belongs to %q; session %s acts for %q: %v",
			name, t.Owner, sessionID, b.Principal, routine.ErrOtherOwner)
	}
	digest, err := t.Digest()
	return b, t, digest, err
}

// routineMethod names a routine run in refusal records.
const routineMethod = "_tether/routine_run"

// routineRequest is the terminal/create a run sends: the template's argv
// (exec'd as it is: Command argv[0], Args the rest), its cwd beneath the
// session's current root, its env, and its files to verify.
func (cn *Conn) routineRequest(b *session, t *routine.Template, opKey string) acp.CreateTerminalRequest {
	cwd := path.Join(b.Tuple.Root, t.Cwd)
	env := make([]acp.EnvVariable, 0, len(t.Env))
	for k, v := range t.Env {
		env = append(env, acp.EnvVariable{Name: k, Value: v})
	}
	sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	meta := acpmeta.MergeMeta(cn.routineOp(b, opKey), acpmeta.Verify{Files: t.Verify}.Meta())
	return acp.CreateTerminalRequest{SessionId: acp.SessionId(b.ID), Command: t.Argv[0], Args: t.Argv[1:],
		Cwd: &cwd, Env: env, Meta: meta}
}

// routineOp is the op tag of a run's requests: the session's current
// tuple digest and a deadline of the command budget (the lease caps it).
func (cn *Conn) routineOp(b *session, opKey string) map[string]any {
	return acpmeta.Op{TupleSHA256: b.Digest, OpKey: opKey, Deadline: cn.c.now().Add(cn.c.opts.CommandBudget)}.Meta()
}

// finishRoutine waits for a run's exit (which records its receipt) and
// releases its terminal with a fresh op key of its own.
func (cn *Conn) finishRoutine(ctx context.Context, h *client, b *session, sid acp.SessionId, id, opKey string) error {
	_, werr := h.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid, TerminalId: id, Meta: cn.routineOp(b, opKey)})
	_, rerr := h.ReleaseTerminal(context.WithoutCancel(ctx), acp.ReleaseTerminalRequest{SessionId: sid, TerminalId: id,
		Meta: cn.routineOp(b, newKey("routine-release"))})
	return errors.Join(werr, rerr)
}
