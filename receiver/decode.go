package receiver

import (
	"bytes"
	"encoding/json"

	"github.com/tetherdev/tether/receiver/wire"
)

// decodeArgs strictly decodes the args of op into the typed struct of
// receiver/wire: exactly one JSON object, no unknown field, no trailing
// data. AttachArgs may also be absent or null. The wire server has
// already refused malformed frames; this is the Handler's own check for
// callers that build requests directly.
func decodeArgs(op wire.Op, raw json.RawMessage) (any, error) {
	var v any
	switch op {
	case wire.OpAttach:
		if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
			return &wire.AttachArgs{}, nil
		}
		v = &wire.AttachArgs{}
	case wire.OpRead:
		v = &wire.ReadArgs{}
	case wire.OpWrite:
		v = &wire.WriteArgs{}
	case wire.OpStat:
		v = &wire.StatArgs{}
	case wire.OpList:
		v = &wire.ListArgs{}
	case wire.OpHash:
		v = &wire.HashArgs{}
	case wire.OpExecStart:
		v = &wire.ExecStartArgs{}
	case wire.OpExecOutput, wire.OpExecWait, wire.OpExecKill, wire.OpExecRelease:
		v = &wire.TerminalArgs{}
	default:
		return nil, wire.Errorf(wire.CodeInvalid, "op %q is not in the closed set", op)
	}
	if err := decodeStrictInto(raw, v); err != nil {
		return nil, wire.Errorf(wire.CodeInvalid, "%s args: %v", op, err)
	}
	return v, nil
}
