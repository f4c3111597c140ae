package custodian

import (
	"context"
	"encoding/json"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/binding"
	"github.com/tetherdev/tether/receiver/wire"
)

// HandleExtensionMethod serves the agent's extension methods; only
// `_tether/attach` is known, and custodian/binding decides it.
func (h *client) HandleExtensionMethod(ctx context.Context, method string, params json.RawMessage) (any, error) {
	if method != acpmeta.MethodAttach {
		return nil, acp.NewMethodNotFound(method)
	}
	return h.conn.table.Attach(ctx, params)
}

// askReceiver sends the attach op on the live connection (waiting for one
// up to the attach timeout) and returns the connection's epoch
// (binding.Hooks.AskReceiver).
func (c *Custodian) askReceiver(ctx context.Context, s *binding.Session) (wire.AttachResult, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.AttachTimeout)
	defer cancel()
	var res wire.AttachResult
	conn, epoch, err := sessionOf(s).Receiver.current(ctx, true)
	if err != nil {
		return res, 0, err
	}
	dl, _ := ctx.Deadline()
	if err := conn.CallFenced(ctx, wire.OpAttach, s.Digest, newKey("attach"), s.FenceToken(), dl, &wire.AttachArgs{}, &res); err != nil {
		return res, 0, err
	}
	return res, epoch, nil
}

// attached follows a confirmed attach of s on epoch
// (binding.Hooks.Attached): the receiver is watched for the connection's
// loss, rec is recorded, and the session's terminals are claimed on the
// new connection.
func (c *Custodian) attached(ctx context.Context, s *binding.Session, epoch uint64, rec audit.Record) {
	b := sessionOf(s)
	b.conn.watch(b.Receiver)
	b.fold(c, acpmeta.MethodAttach).record(rec)
	c.claimTerminals(ctx, b, epoch)
}
