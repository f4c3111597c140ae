package wire

import (
	"errors"

	"github.com/tetherdev/tether/admission/errcode"
)

// testDigest is a well-formed tuple digest for the decode tests.
const testDigest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func codeOf(err error) errcode.Code {
	var e *errcode.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
