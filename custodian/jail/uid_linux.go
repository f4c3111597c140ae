package jail

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/idfiles"
)

// uidLease is the agent's uid and gid, held for the life of one jail by
// an exclusive lock on <LockDir>/uid-<uid>.lock: no other jail draws or
// pins that uid while the lock is held, and the lock ends with the
// process that holds it, so a killed custodian frees its uid. release
// closes the lock file; it is safe twice.
type uidLease struct {
	uid, gid uint32
	lock     *os.File
}

func (l *uidLease) release() {
	if l != nil && l.lock != nil {
		l.lock.Close()
		l.lock = nil
	}
}

// acquireUID leases the jail's uid: the pinned one (refused with ErrUID
// while another live jail holds it), or one drawn from the range that no
// process uses (as its real, effective, saved or file system uid or gid),
// that /etc/passwd and /etc/group do not name, and that no live jail
// holds. 65534 and 65535 are never drawn.
func acquireUID(s *Spec) (*uidLease, error) {
	if err := checkLockDir(s.LockDir); err != nil {
		return nil, err
	}
	if s.Pinned {
		f, ok, err := lockUID(s.LockDir, s.UID)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: the pinned uid %d (jail.uid) is in use by another live jail: unset jail.uid to draw one per jail", ErrUID, s.UID)
		}
		return &uidLease{uid: s.UID, gid: s.GID, lock: f}, nil
	}
	return drawUID(s.LockDir, s.UIDs)
}

// drawUID tries every id of r once, from a random start.
func drawUID(dir string, r IDRange) (*uidLease, error) {
	named := map[uint32]bool{}
	if err := idfiles.Named(named, "/etc/passwd", 2, 3); err != nil {
		return nil, fmt.Errorf("%w: read /etc/passwd: %w", ErrUID, err)
	}
	if err := idfiles.Named(named, "/etc/group", 2); err != nil {
		return nil, fmt.Errorf("%w: read /etc/group: %w", ErrUID, err)
	}
	used, err := processIDs()
	if err != nil {
		return nil, fmt.Errorf("%w: list the ids processes use: %w", ErrUID, err)
	}
	n := uint64(r.Last-r.First) + 1
	start := rand.Uint64N(n)
	for i := range n {
		id := r.First + uint32((start+i)%n)
		if id == 65534 || id == 65535 || named[id] || used[id] {
			continue
		}
		f, ok, err := lockUID(dir, id)
		if err != nil {
			return nil, err
		}
		if ok {
			return &uidLease{uid: id, gid: id, lock: f}, nil
		}
	}
	return nil, fmt.Errorf("%w: no free uid in %d-%d (jail.uid_range): each is named in /etc/passwd or /etc/group, used by a process or held by a live jail",
		ErrUID, r.First, r.Last)
}

// checkLockDir makes the lock directory (root's, 0700) or checks the one
// there: a directory, not a symlink, owned by root, writable by no one
// else.
func checkLockDir(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return fmt.Errorf("%w: lock directory %q is not an absolute clean path", ErrConfig, dir)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: make the lock directory: %w", ErrUID, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("%w: check the lock directory: %w", ErrUID, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: check the lock directory: %s must be a directory owned by root and writable by no one else (uid %d, mode %o)",
			ErrUID, dir, st.Uid, st.Mode)
	}
	return nil
}

// lockUID takes the lock of uid without waiting. ok is false when a live
// jail holds it.
func lockUID(dir string, uid uint32) (f *os.File, ok bool, err error) {
	path := filepath.Join(dir, "uid-"+strconv.FormatUint(uint64(uid), 10)+".lock")
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("%w: open the lock of uid %d: %w", ErrUID, uid, err)
	}
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		return f, true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		f.Close()
		return nil, false, nil
	default:
		f.Close()
		return nil, false, fmt.Errorf("%w: lock uid %d: %w", ErrUID, uid, err)
	}
}

// processIDs returns every uid and gid a process uses (the Uid: and Gid:
// lines of /proc/PID/status: real, effective, saved, file system). A
// process that ends while it is read is skipped.
func processIDs() (map[uint32]bool, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[uint32]bool{}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		statusIDs(string(data), out)
	}
	return out, nil
}

// statusIDs adds the ids of a /proc/PID/status text's Uid: and Gid:
// lines to out.
func statusIDs(status string, out map[uint32]bool) {
	for _, line := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "Uid" && k != "Gid") {
			continue
		}
		for _, f := range strings.Fields(v) {
			if id, err := strconv.ParseUint(f, 10, 32); err == nil {
				out[uint32(id)] = true
			}
		}
	}
}
