package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// skipSweep, set only by tests, turns the sweep off: the positive control
// that shows a killed custodian's scratch directory stays without it.
var skipSweep bool

// sweepScratch removes the scratch directories in parent that jails of
// killed custodians left: a directory named scratchName(uid, …), owned
// by root, mode 0700, not a symlink, whose uid no live jail holds (its
// lock is free, or it is own, the uid this start holds). Only an empty
// directory is removed (rmdir, never recursive: the jail's files lived on
// a tmpfs in a mount namespace that died with it). A directory of a live
// jail, or anything else, is left alone. The error lists what could not
// be removed; it does not stop the start.
func sweepScratch(parent, lockDir string, own uint32) error {
	if skipSweep {
		return nil
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		return fmt.Errorf("list %s: %w", parent, err)
	}
	var errs []error
	for _, e := range ents {
		uid, ok := parseScratchName(e.Name())
		if !ok {
			continue
		}
		if err := sweepOne(filepath.Join(parent, e.Name()), lockDir, uid, own); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sweepOne removes one stale scratch directory, if it is one.
func sweepOne(path, lockDir string, uid, own uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil // gone meanwhile
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o7777 != 0o700 {
		return nil // not one this package made
	}
	if uid != own {
		f, ok, err := lockUID(lockDir, uid)
		if err != nil || !ok {
			return err // a live jail's, or its lock cannot be read
		}
		defer f.Close()
	}
	if err := unix.Rmdir(path); err != nil {
		return fmt.Errorf("remove the scratch directory %s left by a killed custodian: %w", path, err)
	}
	return nil
}
