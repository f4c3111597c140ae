package opstore

import (
	"fmt"

	"github.com/tetherdev/tether/custodian/credfile"
)

// CheckPrivateDir refuses a state directory that is a symlink, is not a
// directory, is not owned by the effective user, or is writable by group
// or others: anyone who can write there can forge or delete receipts.
func CheckPrivateDir(dir string) error {
	if err := credfile.CheckPrivateDir(dir); err != nil {
		return fmt.Errorf("%w: state directory: %w", ErrInvalid, err)
	}
	return nil
}
