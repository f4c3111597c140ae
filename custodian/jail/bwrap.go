package jail

import (
	"fmt"
	"path/filepath"
	"strconv"
)

// Descriptors bwrap receives beyond stdin, stdout and stderr.
const (
	initSpecFD = 3 // the init's JSON spec; passed through to the init
	passwdFD   = 4 // the jail's /etc/passwd (bwrap reads it, then closes it)
	groupFD    = 5 // the jail's /etc/group
)

// InitArg is argv[1] of the jail's init: HelperMain runs the init when it
// sees it.
const InitArg = "__tether-jail-init"

// bwrapArgs builds bubblewrap's command line for spec. home and tmp are the
// host directories (on the private tmpfs) shown as Home and Tmp. Order
// matters: bwrap applies the options in turn, so the writable directories
// come first (a view may lie inside /tmp), the placeholder after every
// view, and the root is made read-only last.
func bwrapArgs(s *Spec, home, tmp string) []string {
	uid, gid := strconv.FormatUint(uint64(s.UID), 10), strconv.FormatUint(uint64(s.GID), 10)
	a := []string{
		"--unshare-user", "--uid", uid, "--gid", gid, "--disable-userns",
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", Hostname, "--unshare-cgroup-try",
	}
	if s.Network == NetworkNone {
		a = append(a, "--unshare-net")
	}
	a = append(a, "--die-with-parent", "--new-session",
		"--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
		"--bind", home, Home, "--bind", tmp, Tmp,
		"--ro-bind-data", strconv.Itoa(passwdFD), "/etc/passwd",
		"--ro-bind-data", strconv.Itoa(groupFD), "/etc/group")
	for _, v := range s.Read {
		a = append(a, viewArgs(v)...)
	}
	for _, v := range s.Exec {
		if !s.shownByRead(v.Dest) {
			a = append(a, viewArgs(v)...)
		}
	}
	if s.binIsLink() {
		a = append(a, "--symlink", "usr/bin", "/bin")
	}
	a = append(a, "--ro-bind", s.Helper, InitPath)
	for _, p := range s.Stubs {
		a = append(a, "--ro-bind", s.Helper, p)
	}
	a = append(a, "--tmpfs", s.Root, "--remount-ro", s.Root, "--chdir", s.Root, "--remount-ro", "/")
	return append(a, InitPath, InitArg)
}

// viewArgs shows one view: a replicated symlink, or a read-only bind.
func viewArgs(v View) []string {
	if v.Link != "" {
		return []string{"--symlink", v.Link, v.Dest}
	}
	return []string{"--ro-bind", v.Source, v.Dest}
}

// shownByRead reports whether a read view already shows p at its path
// (p beneath a directory bound at its own path, through replicated
// symlinks). Binding p again inside a read-only bind would fail.
func (s *Spec) shownByRead(p string) bool {
	dir := filepath.Dir(p)
	for _, v := range s.Read {
		if v.Link != "" && within(v.Dest, dir) {
			target := v.Link
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(v.Dest), target)
			}
			return s.shownByRead(filepath.Join(target, p[len(v.Dest):]))
		}
		if v.Link == "" && within(v.Dest, p) {
			return true
		}
	}
	return false
}

// binIsLink reports whether the jail's /bin is a symlink to usr/bin, as
// on the host.
func (s *Spec) binIsLink() bool { return (&builder{spec: s}).binIsLink() }

// passwd and group are the jail's account files: root, the agent, nobody.
func (s *Spec) passwd() string {
	return fmt.Sprintf("root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nagent:x:%d:%d:tether agent:%s:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		s.UID, s.GID, Home)
}

func (s *Spec) group() string {
	return fmt.Sprintf("root:x:0:\nagent:x:%d:\nnogroup:x:65534:\n", s.GID)
}
