package custodian

import (
	"context"
	"fmt"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/internal/durable"
)

func mkdirPrivate(dir string) error {
	if err := durable.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("custodian: create state directory: %w", err)
	}
	return nil
}

func refusalUnavailable(format string, args ...any) error {
	return acperr.NewError(errcode.CodeUnavailable, format, args...)
}

func contextBackground() context.Context { return context.Background() }
