package opstore

import (
	"fmt"
	"os"
	"syscall"
)

// CheckPrivateDir refuses a state directory that is a symlink, is not a
// directory, is not owned by the effective user, or is writable by group
// or others: anyone who can write there can forge or delete receipts.
func CheckPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: state directory %s is not a directory (symlinks are refused)", ErrInvalid, dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: state directory %s: no owner information", ErrInvalid, dir)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: state directory %s is owned by uid %d, not %d", ErrInvalid, dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: state directory %s has mode %#o: writable by group or others", ErrInvalid, dir, fi.Mode().Perm())
	}
	return nil
}
