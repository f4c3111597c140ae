package spawn

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// fsCaps are the capabilities that let a thread see past file permissions;
// the lookup identity must hold none of them.
var fsCaps = []struct {
	bit  uint
	name string
}{{unix.CAP_DAC_OVERRIDE, "DAC_OVERRIDE"}, {unix.CAP_DAC_READ_SEARCH, "DAC_READ_SEARCH"}, {unix.CAP_FOWNER, "FOWNER"}}

// lookPathAs finds the bare command spec.Path in spec.Search as the child
// will see the file system: it takes on the child's uid, gid and groups as
// the calling thread's filesystem identity, looks each candidate up with
// faccessat2(X_OK, AT_EACCESS) and stat, then restores the thread. With a
// Landlock ruleset, a candidate that is not beneath one of its execute
// rules (the root's view: the grant root plus the configured system paths)
// is skipped too, since the child could not execute it. A directory the
// child cannot search and a file it cannot execute are skipped like
// missing ones, and "not found" is one answer whatever the reason, so the
// lookup reveals nothing the child could not see itself.
//
// WARNING: thread-sensitive. It changes credentials of the calling thread
// only (raw setgroups, setfsgid, setfsuid: never Go's all-thread
// syscall.Setgroups), so it must run on the locked spawning thread, which
// is destroyed once its child is reaped. Tested as root by
//
//	go test -race -run 'TestLookPath' ./receiver/spawn/ ./receiver/
func lookPathAs(spec *Spec) (string, error) {
	var found string
	err := asChildFS(spec, func() {
		for _, dir := range spec.Search {
			p := filepath.Join(dir, spec.Path)
			if unix.Faccessat2(unix.AT_FDCWD, p, unix.X_OK, unix.AT_EACCESS) != nil {
				continue
			}
			var st unix.Stat_t
			if unix.Stat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
				continue
			}
			if spec.Landlock == nil || spec.Landlock.beneathExec(p) {
				found = p
				return
			}
		}
	})
	if err != nil {
		return "", err
	}
	if found == "" {
		return "", fmt.Errorf("%w: %q in %q as uid %d", ErrNotFound, spec.Path, strings.Join(spec.Search, ":"), spec.UID)
	}
	return found, nil
}

// asChildFS runs f with the child's filesystem identity on the calling
// thread and restores the thread's identity afterwards. Setting a nonzero
// fsuid makes the kernel drop the file capabilities from the effective
// set; both the switch and the restore are verified, and any mismatch is
// an error (f does not run, or its answer is not used).
func asChildFS(spec *Spec, f func()) error {
	groups, err := unix.Getgroups()
	if err != nil {
		return fmt.Errorf("%w: getgroups: %w", ErrStart, err)
	}
	fsuid, fsgid := currentFS()
	effective, err := effectiveCaps()
	if err != nil {
		return err
	}
	want := make([]int, len(spec.Groups))
	for i, g := range spec.Groups {
		want[i] = int(g)
	}
	serr := setFS(want, int(spec.GID), int(spec.UID))
	if serr == nil {
		serr = verifyLookupIdentity(spec, want)
	}
	if serr == nil {
		f()
	}
	rerr := setFS(groups, fsgid, fsuid)
	if rerr == nil {
		rerr = verifyRestored(groups, fsuid, fsgid, effective)
	}
	switch {
	case serr != nil:
		return fmt.Errorf("%w: take on the child's identity for the PATH lookup: %w", ErrStart, serr)
	case rerr != nil:
		return fmt.Errorf("%w: restore the spawning thread after the PATH lookup: %w", ErrStart, rerr)
	}
	return nil
}

// setFS sets the calling thread's supplementary groups, fsgid and fsuid,
// in that order (the groups and fsgid need CAP_SETGID, which a nonzero
// fsuid would not take away, but the order keeps the thread's identity
// consistent at every step).
func setFS(groups []int, fsgid, fsuid int) error {
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	unix.Setfsgid(fsgid)
	unix.Setfsuid(fsuid)
	return nil
}

// currentFS returns the calling thread's fsuid and fsgid (setfs*id with an
// invalid id changes nothing and returns the current value).
func currentFS() (uid, gid int) {
	uid, _ = unix.SetfsuidRetUid(-1)
	gid, _ = unix.SetfsgidRetGid(-1)
	return uid, gid
}

func verifyLookupIdentity(spec *Spec, groups []int) error {
	if err := verifyFS(groups, int(spec.UID), int(spec.GID)); err != nil {
		return err
	}
	eff, err := effectiveCaps()
	if err != nil {
		return err
	}
	for _, c := range fsCaps {
		if eff&(1<<c.bit) != 0 {
			return fmt.Errorf("the lookup identity still holds %s", c.name)
		}
	}
	return nil
}

func verifyRestored(groups []int, fsuid, fsgid int, effective uint64) error {
	if err := verifyFS(groups, fsuid, fsgid); err != nil {
		return err
	}
	eff, err := effectiveCaps()
	if err != nil {
		return err
	}
	if eff != effective {
		return fmt.Errorf("effective capabilities %016x, were %016x", eff, effective)
	}
	return nil
}

// verifyFS checks the calling thread's fsuid, fsgid and groups.
func verifyFS(groups []int, fsuid, fsgid int) error {
	gotUID, gotGID := currentFS()
	got, err := unix.Getgroups()
	if err != nil {
		return fmt.Errorf("getgroups: %w", err)
	}
	slices.Sort(got)
	got = slices.Compact(got)
	want := slices.Clone(groups)
	slices.Sort(want)
	want = slices.Compact(want)
	if gotUID != fsuid || gotGID != fsgid || !slices.Equal(got, want) {
		return fmt.Errorf("fsuid %d fsgid %d groups %v, want %d %d %v", gotUID, gotGID, got, fsuid, fsgid, want)
	}
	return nil
}

// effectiveCaps returns the calling thread's effective set.
func effectiveCaps() (uint64, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, fmt.Errorf("%w: capget: %w", ErrStart, err)
	}
	return uint64(data[1].Effective)<<32 | uint64(data[0].Effective), nil
}
