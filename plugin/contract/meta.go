package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/strictjson"
)

// MetaFromJSON decodes a `_meta` object with the one strict decoder (a key
// given twice, at any depth, is refused: `tether/bind` has one reading).
// Empty input or JSON null is no meta; anything but an object is an error
// wrapping acpmeta.ErrMeta. Each value is kept as the json.RawMessage it
// arrived as (acpmeta's readers decode such values as they decode any
// other).
func MetaFromJSON(b []byte) (map[string]any, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if string(bytes.TrimSpace(b)) == "null" {
		return nil, nil
	}
	var raw map[string]json.RawMessage
	if err := strictjson.Decode(b, acpmeta.MaxValueBytes, &raw); err != nil {
		return nil, fmt.Errorf("%w: _meta is not one strict JSON object: %w", acpmeta.ErrMeta, err)
	}
	m := make(map[string]any, len(raw))
	for k, v := range raw {
		m[k] = v
	}
	return m, nil
}

// PeerMessage returns the message of a refusal without its wrapping: a
// *errcode.Error's message, the `message` a tether JSON-RPC error carries in
// its data (acperr.NewError), or another JSON-RPC error's code, message
// and data error; anything else is err.Error().
func PeerMessage(err error) string {
	var we *errcode.Error
	if errors.As(err, &we) {
		return we.Message
	}
	var re *acp.RequestError
	if !errors.As(err, &re) {
		return err.Error()
	}
	data, _ := re.Data.(map[string]any)
	if msg, ok := data["message"].(string); ok && msg != "" {
		if _, tether := acperr.CodeOf(re); tether {
			return msg
		}
	}
	if detail, ok := data["error"].(string); ok && detail != "" {
		return fmt.Sprintf("JSON-RPC error %d: %s (%s)", re.Code, re.Message, detail)
	}
	return fmt.Sprintf("JSON-RPC error %d: %s", re.Code, re.Message)
}
