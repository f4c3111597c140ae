package custodian

import (
	"context"
	"fmt"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/custodian/internal/durable"
	"github.com/tetherdev/tether/receiver/wire"
)

func mkdirPrivate(dir string) error {
	if err := durable.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("custodian: create state directory: %w", err)
	}
	return nil
}

func refusalUnavailable(format string, args ...any) error {
	return acpmeta.NewError(wire.CodeUnavailable, format, args...)
}

func contextBackground() context.Context { return context.Background() }
