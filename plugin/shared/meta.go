package shared

import (
	"encoding/json"
	"errors"
	"fmt"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	pb "github.com/tetherdev/tether/plugin/proto"
	"github.com/tetherdev/tether/receiver/wire"
)

// metaJSON encodes a `_meta` map for the wire. Values the plugin builds are
// json.RawMessage (already encoded once) or plain JSON data.
func metaJSON(m map[string]any) []byte {
	if m == nil {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		// Every `_meta` value the plugin builds is plain JSON data.
		panic(fmt.Sprintf("shared: marshal _meta: %v", err))
	}
	return b
}

// MetaFromJSON decodes a `_meta` object. Empty input or JSON null is no
// meta; anything but an object is an error wrapping acpmeta.ErrMeta. Each
// value is kept as the json.RawMessage it arrived as, so the host sends it
// on unchanged without decoding and re-encoding it (acpmeta's readers
// decode such values as they decode any other).
func MetaFromJSON(b []byte) (map[string]any, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%w: _meta is not a JSON object: %v", acpmeta.ErrMeta, err)
	}
	if raw == nil {
		return nil, nil
	}
	m := make(map[string]any, len(raw))
	for k, v := range raw {
		m[k] = v
	}
	return m, nil
}

// RawMeta returns a one-entry `_meta` map whose value is encoded once, now.
func RawMeta(key string, v any) map[string]any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("shared: marshal _meta[%q]: %v", key, err))
	}
	return map[string]any{key: json.RawMessage(b)}
}

// PeerMessage returns the message of a refusal without its wrapping: a
// *wire.Error's message, the `message` a tether JSON-RPC error carries in
// its data (acpmeta.NewError), or another JSON-RPC error's code, message
// and data error; anything else is err.Error().
func PeerMessage(err error) string {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Message
	}
	var re *acp.RequestError
	if !errors.As(err, &re) {
		return err.Error()
	}
	data, _ := re.Data.(map[string]any)
	if msg, ok := data["message"].(string); ok && msg != "" {
		if _, tether := acpmeta.CodeOf(re); tether {
			return msg
		}
	}
	if detail, ok := data["error"].(string); ok && detail != "" {
		return fmt.Sprintf("JSON-RPC error %d: %s (%s)", re.Code, re.Message, detail)
	}
	return fmt.Sprintf("JSON-RPC error %d: %s", re.Code, re.Message)
}

// stepPB encodes one RunTerminal step.
func stepPB(s Step) *pb.AcpStep {
	out := &pb.AcpStep{Sent: s.Sent}
	if s.Err == nil {
		return out
	}
	var re *acp.RequestError
	if errors.As(s.Err, &re) && !errors.Is(s.Err, ErrTransport) {
		out.Error = jsonRPCErrorPB(re)
	} else {
		out.TransportError = s.Err.Error()
	}
	return out
}

// stepFromPB decodes one RunTerminal step.
func stepFromPB(s *pb.AcpStep) Step {
	out := Step{Sent: s.GetSent()}
	switch {
	case s.GetError() != nil:
		out.Err = jsonRPCErrorFromPB(s.GetError())
	case s.GetTransportError() != "":
		out.Err = fmt.Errorf("%w: %s", ErrTransport, s.GetTransportError())
	}
	return out
}

func jsonRPCErrorPB(re *acp.RequestError) *pb.JsonRpcError {
	var data []byte
	if re.Data != nil {
		data, _ = json.Marshal(re.Data)
	}
	return &pb.JsonRpcError{Code: int32(re.Code), Message: re.Message, DataJson: data}
}

func jsonRPCErrorFromPB(je *pb.JsonRpcError) *acp.RequestError {
	re := &acp.RequestError{Code: int(je.GetCode()), Message: je.GetMessage()}
	if len(je.GetDataJson()) > 0 {
		var data any
		if json.Unmarshal(je.GetDataJson(), &data) == nil {
			re.Data = data
		}
	}
	return re
}
