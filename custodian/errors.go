package custodian

import (
	"errors"
	"fmt"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/binding"
)

// Errors callers branch on with errors.Is.
var (
	// ErrConfig: a configuration or binding the custodian cannot enforce.
	ErrConfig = errors.New("custodian: invalid configuration")
	// ErrClosed: the custodian was closed.
	ErrClosed = errors.New("custodian: closed")
	// ErrBind: a session could not be bound (the receiver refused the
	// tuple, or the agent answered with another session).
	ErrBind = binding.ErrBind
	// ErrRetention: a lease extension could not be recorded in the
	// operation-key store, so it was not applied (the keys already
	// dispatched would be forgotten inside the extended lease).
	ErrRetention = errors.New("custodian: cannot keep operation keys for the extended lease")
)

// refusal converts any error into the JSON-RPC error returned to the
// agent (binding.Refusal).
var refusal = binding.Refusal

// codeMessage splits err into the code and message a receipt records.
func codeMessage(err error) (errcode.Code, string) {
	var we *errcode.Error
	if errors.As(err, &we) && we.Code.Valid() {
		if we.Code == errcode.CodeFateUnknown {
			return we.Code, err.Error() // keep the cause (ctx, lost connection)
		}
		return we.Code, we.Message
	}
	return errcode.CodeInternal, fmt.Sprintf("custodian: %v", err)
}
