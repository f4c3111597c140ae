// Package acperr is the ACP SDK's side of the error shape admission/acpmeta
// defines: it builds the *acp.RequestError a tether refusal is answered
// with and reads the tether code back out of one. It is kept out of
// acpmeta so that the contract stays a leaf (standard library and other
// leaves only); the custodian, the plugin and the hosts import both.
package acperr

import (
	"encoding/json"
	"errors"
	"fmt"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
)

// NewError returns the JSON-RPC error for a tether refusal. The SDK passes a
// *acp.RequestError through unchanged only when it is returned unwrapped,
// so handlers must return this value itself.
func NewError(code errcode.Code, format string, args ...any) *acp.RequestError {
	msg := fmt.Sprintf(format, args...)
	return &acp.RequestError{
		Code:    acpmeta.ErrorCode,
		Message: fmt.Sprintf("tether %s: %s", code, msg),
		Data:    map[string]any{acpmeta.DataKey: string(code), "message": msg},
	}
}

// ResourceNotFoundCode is ACP's own JSON-RPC error code for "a given
// resource, such as a file, was not found" (the schema's ErrorCode
// -32002).
const ResourceNotFoundCode = -32002

// ResourceNotFound returns e, a not_found refusal of a read of the file
// at uri, in the form ACP defines for a missing file and other clients
// send (Zed, the TypeScript SDK's RequestError.resourceNotFound): code
// ResourceNotFoundCode, message "Resource not found: URI", data.uri. Its
// data keeps the tether code and message, so CodeOf still reads
// not_found. Agents recognise a missing file by it (Gemini CLI matches
// "Resource not found" in the message), where -32010 looks like a
// failure to read. Any other error is returned unchanged.
func ResourceNotFound(e *acp.RequestError, uri string) *acp.RequestError {
	if code, ok := CodeOf(e); !ok || code != errcode.CodeNotFound {
		return e
	}
	data := map[string]any{acpmeta.DataKey: string(errcode.CodeNotFound), "uri": uri}
	var old struct {
		Message string `json:"message"`
	}
	if remarshalLoose(e.Data, &old) == nil && old.Message != "" {
		data["message"] = old.Message
	}
	return &acp.RequestError{Code: ResourceNotFoundCode, Message: "Resource not found: " + uri, Data: data}
}

// FromWire converts a receiver error into the ACP error with the same code.
func FromWire(e *errcode.Error) *acp.RequestError { return NewError(e.Code, "%s", e.Message) }

// CodeOf returns the tether code carried by err, if err is (or wraps) an
// *acp.RequestError whose data names a member of the closed set, or a
// *errcode.Error.
func CodeOf(err error) (errcode.Code, bool) {
	var we *errcode.Error
	if errors.As(err, &we) {
		return we.Code, we.Code.Valid()
	}
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Data == nil {
		return "", false
	}
	var data struct {
		Tether errcode.Code `json:"tether"`
	}
	if remarshalLoose(re.Data, &data) != nil || !data.Tether.Valid() {
		return "", false
	}
	return data.Tether, true
}

func remarshalLoose(v any, out any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, out)
}
