package jail

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// MinLandlockABI is the Landlock ABI the jail needs: every file system
// right up to ABI 5 and the signal and abstract-unix-socket scopes of ABI
// 6. There is no downgrade.
const MinLandlockABI = 6

// neededCaps are the custodian's capabilities the jail uses: mount the
// private tmpfs (SYS_ADMIN), give it to the agent (CHOWN), start bwrap as
// the agent's ids (SETUID, SETGID), drop the bounding set (SETPCAP) and
// empty the agent's files afterwards (DAC_OVERRIDE, FOWNER).
var neededCaps = []struct {
	cap  uint
	name string
}{
	{unix.CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}, {unix.CAP_SETUID, "CAP_SETUID"}, {unix.CAP_SETGID, "CAP_SETGID"},
	{unix.CAP_CHOWN, "CAP_CHOWN"}, {unix.CAP_SETPCAP, "CAP_SETPCAP"},
	{unix.CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"}, {unix.CAP_FOWNER, "CAP_FOWNER"},
}

// Check reports what this machine or process lacks to start spec's jail:
// the capabilities (ErrPrivilege), bubblewrap (ErrBwrap), Landlock
// (ErrLandlock), user namespaces (ErrUserns), a cgroup that can hold the
// limits unless jail.cgroup is off (ErrCgroup). Every message says what to
// do, including the opt-out: --no-jail, which runs the agent unconfined
// and is recorded in the audit log.
func Check(spec *Spec) error {
	for _, check := range []func(*Spec) error{checkCaps, checkBwrap, checkLandlock, checkUserns, checkCgroup} {
		if err := check(spec); err != nil {
			return err
		}
	}
	return nil
}

func checkCaps(*Spec) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w: capget: %w", ErrPrivilege, err)
	}
	var missing []string
	for _, c := range neededCaps {
		if data[c.cap/32].Effective&(1<<(c.cap%32)) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the agent jail needs root: this process (uid %d) lacks %s; run tether-custodian as root, "+
			"or pass --no-jail to run the agent unconfined (recorded in the audit log)", ErrPrivilege, os.Geteuid(), strings.Join(missing, ", "))
	}
	return nil
}

// checkBwrap accepts a regular file owned by root, writable by nobody
// else, and not set-uid: bwrap runs unprivileged, in a user namespace.
func checkBwrap(s *Spec) error {
	var st unix.Stat_t
	if err := unix.Stat(s.Bwrap, &st); err != nil {
		return fmt.Errorf("%w: %s: %w; install the Debian package bubblewrap (ci/setup does), set jail.bwrap, or pass --no-jail", ErrBwrap, s.Bwrap, err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		return fmt.Errorf("%w: %s is not a regular file", ErrBwrap, s.Bwrap)
	case st.Uid != 0:
		return fmt.Errorf("%w: %s is owned by uid %d, not root", ErrBwrap, s.Bwrap, st.Uid)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("%w: %s is writable by group or others (mode %o)", ErrBwrap, s.Bwrap, st.Mode&0o7777)
	case st.Mode&0o111 == 0:
		return fmt.Errorf("%w: %s is not executable", ErrBwrap, s.Bwrap)
	}
	return nil
}

func checkLandlock(*Spec) error {
	if abi := LandlockABI(); abi < MinLandlockABI {
		return fmt.Errorf("%w: the kernel's Landlock ABI is %d, the jail's exec allowlist needs %d (Linux 6.12 or later, with landlock in the lsm= list); or pass --no-jail",
			ErrLandlock, abi, MinLandlockABI)
	}
	return nil
}

// checkCgroup finds where the jail's cgroup would go (cgroupBases).
func checkCgroup(s *Spec) error {
	if s.Cgroup == CgroupOff {
		return nil
	}
	_, _, err := cgroupBases()
	return err
}

// checkUserns reads user.max_user_namespaces (and Debian's older
// kernel.unprivileged_userns_clone where it exists).
func checkUserns(*Spec) error {
	for _, f := range []struct{ path, bad string }{
		{"/proc/sys/user/max_user_namespaces", "0"},
		{"/proc/sys/kernel/unprivileged_userns_clone", "0"},
	} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			continue
		}
		if v := strings.TrimSpace(string(data)); v == f.bad {
			return fmt.Errorf("%w: %s is %s: bubblewrap cannot make the jail's user namespace; set it to a positive value, or pass --no-jail", ErrUserns, f.path, v)
		}
	}
	return nil
}

// Banner is what the jail prints to the agent's stderr when it starts:
// what the agent runs as, sees, may write and may execute.
func (s *Spec) Banner() string {
	var read []string
	for _, v := range s.Read {
		read = append(read, v.Dest)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "tether jail: the agent runs confined: uid %d gid %d, no capabilities, no_new_privs, network %s, own pid/ipc/uts namespaces\n",
		s.UID, s.GID, s.Network)
	if s.bounds != "" {
		fmt.Fprintf(&b, "tether jail: bounds: %s\n", s.bounds)
	}
	fmt.Fprintf(&b, "tether jail: %s\n", s.networkLine())
	fmt.Fprintf(&b, "tether jail: visible read-only: %s\n", strings.Join(read, " "))
	fmt.Fprintf(&b, "tether jail: writable: %s (HOME) and %s, noexec, emptied when the agent ends\n", Home, Tmp)
	fmt.Fprintf(&b, "tether jail: exec allowed: %s; anything else (a shell included) is refused\n", strings.Join(s.execAllowedNoStubs(), " "))
	fmt.Fprintf(&b, "tether jail: cwd %s is an empty read-only placeholder: the computer is reached only through ACP fs/* and terminal/*\n", s.Root)
	return b.String()
}

func (s *Spec) execAllowedNoStubs() []string {
	var out []string
	for _, v := range s.Exec {
		out = append(out, v.Dest)
	}
	return out
}
