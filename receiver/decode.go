package receiver

import (
	"errors"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/wire"
)

// decodeArgs returns the typed args of req through the one decoder of
// receiver/wire (strict: exactly one object, exact keys, no duplicates,
// documented bounds). On a request the wire server dispatched they were
// decoded once already and are reused; a request built by a direct caller
// is decoded here. Every failure is a *errcode.Error with CodeInvalid.
func decodeArgs(req *wire.Request) (any, error) {
	args, err := req.DecodeArgs()
	if err == nil {
		return args, nil
	}
	var we *errcode.Error
	if errors.As(err, &we) {
		return nil, we
	}
	return nil, errcode.Errorf(errcode.CodeInvalid, "%s args: %v", req.Op, err)
}
