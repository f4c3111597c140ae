package spawn

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MinLandlockABI is the Landlock ABI a Ruleset needs: file system rights
// up to ABI 5 (including truncate and device ioctl), the TCP bind and
// connect rights of ABI 4, and the signal and abstract-unix-socket scopes
// of ABI 6. A kernel below it is refused; there is no downgrade. A kernel
// with a later ABI (7 adds only audit logging flags) enforces exactly
// this ruleset.
const MinLandlockABI = 6

// Access is a set of Landlock file system rights.
type Access uint64

// Access sets for rules.
const (
	// AccessAll is every right a Ruleset handles (ABI 5 file system set).
	AccessAll Access = 1<<16 - 1
	// AccessReadExec reads files and directories and executes files.
	AccessReadExec Access = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	// AccessReadWriteFile reads, writes and truncates files (devices such
	// as /dev/null), with ioctl on devices.
	AccessReadWriteFile Access = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	// fileRights are the rights that apply to a non-directory.
	fileRights Access = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	// scopes isolate abstract unix sockets and signals to the domain.
	scopes = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
	// netRights are the network rights a Ruleset handles: binding and
	// connecting TCP sockets (ABI 4), allowed only on the ports of its
	// PortRules.
	netRights = NetBindTCP | NetConnectTCP
)

// NetAccess is a set of Landlock network rights.
type NetAccess uint64

// Network rights for PortRules.
const (
	// NetBindTCP allows binding a TCP socket to the port.
	NetBindTCP NetAccess = unix.LANDLOCK_ACCESS_NET_BIND_TCP
	// NetConnectTCP allows connecting a TCP socket to the port.
	NetConnectTCP NetAccess = unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
)

// PortRule allows Access on one TCP port (any address). Without one, a
// confined child can neither bind nor connect any TCP socket.
type PortRule struct {
	Port   uint16
	Access NetAccess
}

// landlockRuleNetPort is LANDLOCK_RULE_NET_PORT; netPortAttr is struct
// landlock_net_port_attr (ABI 4).
const landlockRuleNetPort = 2

type netPortAttr struct {
	allowedAccess, port uint64
}

// ErrLandlock wraps every Landlock failure, including a kernel whose ABI
// is below MinLandlockABI.
var ErrLandlock = errors.New("landlock")

// Rule grants Access beneath one file or directory, given as an open
// descriptor (O_PATH is enough).
type Rule struct {
	File   *os.File
	Access Access
}

// Ruleset is a Landlock ruleset. Start enforces it on the spawning thread
// alone (landlock_restrict_self without TSYNC) right before the fork, so
// the child and its descendants are confined and the receiver is not.
// Close releases it; a Ruleset may be used by many concurrent Starts.
type Ruleset struct {
	fd int
	// exec holds the identities of the rules that grant EXECUTE, so a PATH
	// lookup can skip what the child could not execute (beneathExec). It
	// is written by NewRuleset only and read-only afterwards.
	exec []fileID
}

// fileID is a file's identity as Landlock sees it: an inode of a device.
type fileID struct{ dev, ino uint64 }

// rulesetAttr is struct landlock_ruleset_attr as of ABI 6.
type rulesetAttr struct {
	handledFS, handledNet, scoped uint64
}

// LandlockABI returns the kernel's Landlock ABI version, 0 if Landlock is
// unsupported or disabled.
func LandlockABI() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0
	}
	return int(v)
}

// NewRuleset builds a ruleset that handles AccessAll, TCP bind and
// connect and both scopes, and allows exactly rules and ports. It fails,
// never downgrades, when the kernel's ABI is below MinLandlockABI.
func NewRuleset(rules []Rule, ports ...PortRule) (*Ruleset, error) {
	return newRuleset(rules, netRights, ports)
}

// NewRulesetAnyTCP is NewRuleset without the TCP rights: the ruleset does
// not handle TCP bind and connect, so a child may bind and connect any
// port. It is meant for a child whose network namespace has nothing but
// its own loopback, where the port rules would protect nothing.
func NewRulesetAnyTCP(rules []Rule) (*Ruleset, error) {
	return newRuleset(rules, 0, nil)
}

func newRuleset(rules []Rule, handledNet NetAccess, ports []PortRule) (*Ruleset, error) {
	if abi := LandlockABI(); abi < MinLandlockABI {
		return nil, fmt.Errorf("%w: kernel ABI %d, need %d", ErrLandlock, abi, MinLandlockABI)
	}
	attr := rulesetAttr{handledFS: uint64(AccessAll), handledNet: uint64(handledNet), scoped: scopes}
	fd, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if e != 0 {
		return nil, fmt.Errorf("%w: create ruleset: %w", ErrLandlock, e)
	}
	rs := &Ruleset{fd: int(fd)}
	for _, r := range rules {
		if err := rs.add(r); err != nil {
			rs.Close()
			return nil, err
		}
	}
	for _, p := range ports {
		if err := rs.addPort(p); err != nil {
			rs.Close()
			return nil, err
		}
	}
	return rs, nil
}

// addPort allows p.Access (within netRights) on TCP port p.Port.
func (rs *Ruleset) addPort(p PortRule) error {
	np := netPortAttr{allowedAccess: uint64(p.Access & netRights), port: uint64(p.Port)}
	if np.allowedAccess == 0 {
		return fmt.Errorf("%w: port rule %d allows nothing", ErrLandlock, p.Port)
	}
	_, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rs.fd), landlockRuleNetPort,
		uintptr(unsafe.Pointer(&np)), 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("%w: add rule for TCP port %d: %w", ErrLandlock, p.Port, e)
	}
	return nil
}

func (rs *Ruleset) add(r Rule) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(r.File.Fd()), &st); err != nil {
		return fmt.Errorf("%w: fstat %s: %w", ErrLandlock, r.File.Name(), err)
	}
	access := r.Access & AccessAll
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		access &= fileRights
	}
	pb := unix.LandlockPathBeneathAttr{Allowed_access: uint64(access), Parent_fd: int32(r.File.Fd())}
	_, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rs.fd), unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&pb)), 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("%w: add rule for %s: %w", ErrLandlock, r.File.Name(), e)
	}
	if access&unix.LANDLOCK_ACCESS_FS_EXECUTE != 0 {
		rs.exec = append(rs.exec, fileID{st.Dev, st.Ino})
	}
	return nil
}

// beneathExec reports whether the file at path p, symlinks resolved, is at
// or beneath a rule that grants EXECUTE, walking up to the root as
// Landlock does. It answers for the calling thread's view of the file
// system (the PATH lookup runs it with the child's identity); the kernel
// still decides at exec time, so a file swapped in between is refused
// there, never allowed by this answer.
func (rs *Ruleset) beneathExec(p string) bool {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return false
	}
	for d := real; ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if unix.Stat(d, &st) != nil {
			return false
		}
		if slices.Contains(rs.exec, fileID{st.Dev, st.Ino}) {
			return true
		}
		if d == "/" || d == "." {
			return false
		}
	}
}

// Close releases the ruleset. It is safe to call twice.
func (rs *Ruleset) Close() error {
	if rs == nil || rs.fd < 0 {
		return nil
	}
	err := unix.Close(rs.fd)
	rs.fd = -1
	return err
}

// restrictThread enforces the ruleset on the calling thread only; the
// thread must have no_new_privs set already.
func (rs *Ruleset) restrictThread() error {
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(rs.fd), 0, 0); e != 0 {
		return fmt.Errorf("%w: restrict the spawning thread: %w", ErrLandlock, e)
	}
	return nil
}
