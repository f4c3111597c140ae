package provision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/tetherdev/tether/admission/atomicfile"
)

// paths is where everything of one computer lives:
//
//	DIR/                    0755 root   the computer
//	  computer.json         0600 root   state: ids, tuple, receiver pid (State)
//	  custodian.json        0600 cust   ready config for tether-custodian run
//	  custodian/            0700 cust   client certificate and key, issuer, audit key, state/
//	  receiver/             0700 root   receiver.json, server certificate and key, issuer, log
//	  coordinator/          0700 root   the admission signing key (the coordinator's)
//	  admission/            0755 root   admission.dsse.json, published by the coordinator
//	  admission.pub         0644 root   the pinned signer (read by the receiver)
//	  run/                  0750 root:custodian gid   the receiver's unix socket
//	  root/                 0700 uid    the tuple's root (when namespaced, disk/project
//	                                    bound here)
//	  disk/                 0700 root   the computer's own file system, when namespaced:
//	    project/            0700 uid      the tuple root's content
//	    home/               0700 uid      the commands' HOME (bound at Home)
//	  disk.img              0600 root   the disk's ext4 image, when namespaced
//	  ns/                   0700 root   the stage mounts the computer's / here
type paths struct {
	dir             string
	state           string
	custodianConfig string
	custodian       string
	cust            CustodianFiles
	auditKey        string
	auditPub        string
	custState       string
	receiver        string
	receiverConfig  string
	recv            ReceiverFiles
	receiverLog     string
	coordinator     string
	signKey         string
	grantsInput     string
	admission       string
	admissionPub    string
	run             string
	socket          string
	root            string
	disk            string
	diskDir         string
	diskProject     string
	diskHome        string
	newRoot         string
}

func layout(dir string) paths {
	j := func(p ...string) string { return filepath.Join(append([]string{dir}, p...)...) }
	return paths{
		dir: dir, state: j("computer.json"), custodianConfig: j("custodian.json"),
		custodian: j("custodian"), cust: CustodianFilesIn(j("custodian")),
		auditKey: j("custodian", "audit.key"), auditPub: j("custodian", "audit.pub"),
		custState: j("custodian", "state"),
		receiver:  j("receiver"), receiverConfig: j("receiver", "receiver.json"), recv: ReceiverFilesIn(j("receiver")),
		receiverLog: j("receiver", "receiver.log"),
		coordinator: j("coordinator"), signKey: j("coordinator", "admission.key"), grantsInput: j("coordinator", "grants.json"),
		admission: j("admission"), admissionPub: j("admission.pub"),
		run: j("run"), socket: j("run", "receiver.sock"), root: j("root"),
		disk: j("disk.img"), diskDir: j("disk"), diskProject: j("disk", "project"), diskHome: j("disk", "home"),
		newRoot: j("ns"),
	}
}

// entries are the names a computer makes directly in DIR; teardown
// removes these and nothing else.
func (p paths) entries() []string {
	return []string{p.custodianConfig, p.custodianConfig + ".tmp", p.custodian, p.receiver, p.coordinator,
		p.admission, p.admissionPub, p.run, p.root, p.diskDir, p.disk, p.newRoot,
		// The state last: a teardown killed before the end leaves it
		// naming what is left, for the next one (Destroy).
		p.state + ".tmp", p.state}
}

// CheckDir resolves dir and checks that it can hold a computer, of any
// kind: absolute, no symlink on the way (the admission loader refuses
// them), absent or an empty directory, and every ancestor traversable by
// others (the grant's uid, or a custodian running as another user,
// reaches its files through them) and safe from substitution: owned by
// root or the caller, and writable by no one else unless sticky (as /tmp
// is), so nobody else can rename the computer's directory away and put
// another in its place. Its errors wrap ErrOptions.
func CheckDir(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%w: dir %q is not absolute", ErrOptions, dir)
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(filepath.Clean(dir)))
	if err != nil {
		return "", fmt.Errorf("%w: dir's parent: %w", ErrOptions, err)
	}
	dir = filepath.Join(parent, filepath.Base(dir))
	switch fi, err := os.Lstat(dir); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return "", fmt.Errorf("%w: %w", ErrOptions, err)
	case !fi.IsDir():
		return "", fmt.Errorf("%w: %s exists and is not a directory", ErrOptions, dir)
	default:
		if empty, err := isEmpty(dir); err != nil || !empty {
			return "", fmt.Errorf("%w: %s exists and is not empty; a computer never takes over a used directory", ErrOptions, dir)
		}
	}
	for d := parent; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrOptions, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return "", fmt.Errorf("%w: %s is not traversable by others (mode %v), so the computer's other users could not reach their files; chmod o+x it or pick another dir",
				ErrOptions, d, fi.Mode().Perm())
		}
		if err := checkAncestorOwner(d, fi); err != nil {
			return "", err
		}
		if d == "/" {
			return dir, nil
		}
	}
}

// checkAncestorOwner refuses an ancestor someone other than root or the
// caller owns, or that others may write without the sticky bit.
func checkAncestorOwner(d string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: %s: no owner information", ErrOptions, d)
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s is owned by uid %d, neither root nor the caller, who could replace what lies below it; pick another dir",
			ErrOptions, d, st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("%w: %s is writable by group or others without the sticky bit (mode %v), so they could rename the computer's directory away; chmod go-w it or pick another dir",
			ErrOptions, d, fi.Mode())
	}
	return nil
}

func isEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

// makeDir makes the computer's own directory (which may exist, empty).
func (c *Local) makeDir(context.Context) error {
	return MakeDirs(Dir{Path: c.paths.dir, Mode: 0o755})
}

// makeLayout creates the directories with explicit modes and owners, so
// nothing depends on the umask.
func (c *Local) makeLayout(context.Context) error {
	p, s := c.paths, c.state
	return MakeDirs(
		Dir{Path: p.dir, Mode: 0o755},
		Dir{Path: p.receiver, Mode: 0o700},
		Dir{Path: p.coordinator, Mode: 0o700},
		Dir{Path: p.admission, Mode: 0o755},
		Dir{Path: p.run, Mode: 0o750, GID: s.CustodianGID},
		Dir{Path: p.custodian, Mode: 0o700, UID: s.CustodianUID, GID: s.CustodianGID},
		Dir{Path: p.root, Mode: 0o700, UID: s.UID, GID: s.GID},
		Dir{Path: p.newRoot, Mode: 0o700},
	)
}

// Dir is one directory of a computer, with its mode and owner (root when
// UID and GID are zero).
type Dir struct {
	Path     string
	Mode     os.FileMode
	UID, GID uint32
}

// MakeDirs creates a computer's directories in order and sets each one's
// owner and mode explicitly, so nothing depends on the umask. The first
// is the computer's own directory, which may already exist (empty, as
// CheckDir allows); the others must not.
func MakeDirs(dirs ...Dir) error {
	for i, d := range dirs {
		err := os.Mkdir(d.Path, d.Mode)
		if err != nil && (i > 0 || !errors.Is(err, os.ErrExist)) {
			return err
		}
		if err := setOwnerMode(d.Path, d.UID, d.GID, d.Mode); err != nil {
			return err
		}
	}
	return nil
}

// setOwnerMode chowns then chmods path (never following a symlink).
func setOwnerMode(path string, uid, gid uint32, mode os.FileMode) error {
	if err := os.Lchown(path, int(uid), int(gid)); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

// writeFile creates path exclusively with mode and owner.
func writeFile(path string, data []byte, mode os.FileMode, uid, gid uint32) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	err = errors.Join(err, f.Chown(int(uid), int(gid)), f.Chmod(mode), f.Close())
	return err
}

// tail returns at most n bytes from the end of the file at path.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-n, 0)
	b := make([]byte, fi.Size()-off)
	_, _ = f.ReadAt(b, off)
	return string(b)
}

// replaceFile replaces path with data through atomicfile.Write (temp file
// path+".tmp", owned by this process), so a reader never sees a partial
// file and a crash leaves the old one or the new one.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	tmp := filepath.Base(path) + ".tmp"
	_ = os.Remove(path + ".tmp")
	return atomicfile.Write(path, data, mode, atomicfile.Options{Temp: tmp, Chown: true, UID: os.Geteuid(), GID: os.Getegid()})
}

// replaceOwnedFile is replaceFile for a file owned by uid and gid (the
// custodian's configuration, rewritten when a grant is published).
func replaceOwnedFile(path string, data []byte, mode os.FileMode, uid, gid uint32) error {
	tmp := filepath.Base(path) + ".tmp"
	_ = os.Remove(path + ".tmp")
	return atomicfile.Write(path, data, mode, atomicfile.Options{Temp: tmp, Chown: true, UID: int(uid), GID: int(gid)})
}
