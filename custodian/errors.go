package custodian

import (
	"errors"
	"fmt"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
)

// Errors callers branch on with errors.Is.
var (
	// ErrConfig: a configuration or binding the custodian cannot enforce.
	ErrConfig = errors.New("custodian: invalid configuration")
	// ErrClosed: the custodian was closed.
	ErrClosed = errors.New("custodian: closed")
	// ErrBind: a session could not be bound (the receiver refused the
	// tuple, or the agent answered with another session).
	ErrBind = errors.New("custodian: bind failed")
	// ErrRetention: a lease extension could not be recorded in the
	// operation-key store, so it was not applied (the keys already
	// dispatched would be forgotten inside the extended lease).
	ErrRetention = errors.New("custodian: cannot keep operation keys for the extended lease")
)

// refusal converts any error into the JSON-RPC error returned to the
// agent: a tether code from the closed set and a message naming the check.
// Errors that carry no code become internal, with a generic message, so
// internals never leak to the agent.
func refusal(err error) *acp.RequestError {
	var re *acp.RequestError
	if errors.As(err, &re) {
		if _, ok := acperr.CodeOf(re); ok {
			return re
		}
	}
	var we *errcode.Error
	if errors.As(err, &we) && we.Code.Valid() {
		return acperr.NewError(we.Code, "%s", we.Message)
	}
	return acperr.NewError(errcode.CodeInternal, "custodian internal error")
}

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
