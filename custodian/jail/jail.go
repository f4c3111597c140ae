// Package jail confines the agent process that `tether-custodian run`
// starts, so that whatever the agent does outside ACP (its own file tools,
// its own shell tool, a hook planted in a settings file) fails closed
// instead of reaching the host or the computer.
//
// The agent runs under bubblewrap (bwrap, unprivileged, in a new user,
// mount, pid, ipc and uts namespace) as an unprivileged uid of its own,
// drawn per jail and held by a lock while it runs, with no capabilities
// and no_new_privs, in a cgroup of its own that bounds its memory and
// processes. Its mount view holds read-only system libraries,
// certificates, its runtime and what the operator allows; a private HOME
// and /tmp (noexec, on a tmpfs only the jail can see, emptied when it
// ends); and, at the tuple root's path, an empty read-only placeholder:
// the computer's files are never visible. A small init that
// runs inside the view (this package's HelperMain) applies a Landlock
// ruleset before it executes the agent, so exec is denied except for an
// allowlist, and signals and abstract unix sockets cannot leave the jail;
// under NetworkHost it also refuses TCP bind, and a seccomp filter
// refuses listen, so the agent serves nothing on the host. Under
// NetworkProxy the agent has a network namespace of its own with only
// loopback, where the one thing it reaches is the egress proxy
// (proxy_linux.go), under a policy of its own.
//
// Use: Build a Spec from a Config and the agent's argv, Start it, and
// Wait (which empties HOME and /tmp, removes the cgroup and frees the
// uid). A binary that starts jails must call HelperMain first thing in
// main: the init and the shell stubs inside the jail are that same
// binary.
package jail

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/tetherdev/tether/egress/policy"
)

// Network modes of Config.Network.
const (
	// NetworkHost keeps the host's network namespace: the agent reaches its
	// model, and also every service on the host's loopback.
	NetworkHost = "host"
	// NetworkNone gives the agent a network namespace of its own with only
	// a loopback interface: it reaches nothing outside the jail.
	NetworkNone = "none"
	// NetworkProxy gives the agent a network namespace of its own with
	// only a loopback interface, on which the egress proxy answers at
	// 127.0.0.1:EgressPort: the agent reaches what Config.Egress allows
	// (its model's endpoint) through the proxy, and nothing else, since
	// the namespace has no route out.
	NetworkProxy = "proxy"
)

// DefaultEgressPort is where, under NetworkProxy, the proxy answers on
// the jail's own loopback: the port a computer finds its egress proxy on
// (computer/api.EgressPort).
const DefaultEgressPort = 3128

// Egress is the egress proxy that serves a jail under NetworkProxy
// (package egress's proxy; the same methods as computer/api.Egress,
// which this package does not import). Attach serves the jail on ln, a
// listener inside the jail's own network namespace, so the listener that
// accepted a connection names the jail; Attach owns ln from then on.
// refused is called for every connection the proxy refuses. Detach
// closes ln and every open connection of id before it returns.
type Egress interface {
	Attach(ctx context.Context, id string, pol policy.Policy, ln net.Listener, refused func(policy.Refusal)) error
	Detach(ctx context.Context, id string) error
}

// Config is the `jail` section of the custodian's config file. Every
// field is optional; the allowlists extend the defaults, never replace
// them.
type Config struct {
	// Read lists host paths (files or directories) the agent may read, such
	// as its install tree. They appear read-only at the same path.
	Read []string `json:"read,omitempty"`
	// Exec lists executables the agent may run besides its own program, such
	// as node. They appear read-only at the same path.
	Exec []string `json:"exec,omitempty"`
	// Network is NetworkHost (the default of this package; the custodian
	// makes NetworkProxy its default where the agent's endpoint is
	// known), NetworkNone or NetworkProxy.
	Network string `json:"network,omitempty"`
	// Egress is the agent's own egress policy under NetworkProxy: what
	// the proxy lets it reach, such as its model's endpoint. Nil denies
	// everything. Refused under another network mode.
	Egress *policy.Policy `json:"egress,omitempty"`
	// EgressPort is the proxy's port on the jail's loopback; default
	// DefaultEgressPort.
	EgressPort int `json:"egress_port,omitempty"`
	// UID pins the agent's uid (and GID its gid, default the uid) instead
	// of a fresh one per jail; 0 is refused. Two jails pinned to the same
	// uid do not run at once: the second is refused (ErrUID).
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	// UIDRange is where each jail's own uid (and gid, the same number) is
	// drawn from when UID is unset; default DefaultUIDFirst..DefaultUIDLast.
	UIDRange *IDRange `json:"uid_range,omitempty"`
	// MaxMemoryBytes bounds the memory of everything in the jail (no swap);
	// default DefaultMaxMemory.
	MaxMemoryBytes *int64 `json:"max_memory_bytes,omitempty"`
	// MaxPids bounds the processes and threads of everything in the jail
	// (cgroup pids.max, and RLIMIT_NPROC of the agent's uid); default
	// DefaultMaxPids.
	MaxPids *int64 `json:"max_pids,omitempty"`
	// Cgroup is CgroupRequired (default: the jail runs in a cgroup of its
	// own that holds the limits, or does not start) or CgroupOff (the
	// operator's explicit opt-out: no memory limit, and only RLIMIT_NPROC
	// bounds processes).
	Cgroup string `json:"cgroup,omitempty"`
	// Bwrap is bubblewrap's path; default DefaultBwrap.
	Bwrap string `json:"bwrap,omitempty"`
}

// IDRange is an inclusive range of ids.
type IDRange struct {
	First uint32 `json:"first"`
	Last  uint32 `json:"last"`
}

// Cgroup modes of Config.Cgroup.
const (
	CgroupRequired = "required"
	CgroupOff      = "off"
)

// Defaults.
const (
	// DefaultUIDFirst and DefaultUIDLast bound the ids each jail draws its
	// own uid and gid from: the top of the range Debian's adduser hands
	// out (up to 59999), below the ids disposable computers draw their
	// grant ids from (60000 and up). 59999, the uid every jail shared
	// before each drew its own, is left out, so a config that pins it
	// never collides with a drawn uid. An id a process uses, or that
	// /etc/passwd or /etc/group names, is never drawn.
	DefaultUIDFirst = 59000
	DefaultUIDLast  = 59998
	// DefaultMaxMemory bounds a jail's memory: 4 GiB, above what a node
	// agent needs (V8's default heap limit on 64-bit is about 2 to 4 GiB,
	// and Claude Code or Gemini CLI run in a few hundred MiB), and far
	// below what it takes to push the host into swap or the OOM killer.
	DefaultMaxMemory = 4 << 30
	// DefaultMaxPids bounds a jail's processes and threads: 512. Node runs
	// about a dozen threads (libuv's pool, V8's workers) and an agent a few
	// helpers; a fork loop stops at 512.
	DefaultMaxPids = 512
	// DefaultLockDir holds one lock file per uid in use by a live jail
	// (root's, 0700).
	DefaultLockDir = "/run/tether-jail"
	// DefaultBwrap is where Debian's bubblewrap package installs bwrap.
	DefaultBwrap = "/usr/bin/bwrap"
	// Home and Tmp are the agent's private writable directories.
	Home = "/home/agent"
	Tmp  = "/tmp"
	// InitPath is where the init (HelperMain) is seen inside the jail.
	InitPath = "/.tether/init"
	// DefaultTmpSize bounds HOME and /tmp together (one tmpfs).
	DefaultTmpSize = 1 << 30
	// Hostname is the jail's host name (its own uts namespace).
	Hostname = "tether-jail"
	// agentPath is the PATH the agent gets.
	agentPath = "/usr/local/bin:/usr/bin:/bin"
)

// DefaultRead is what every jail shows read-only: system libraries (for
// dynamically linked runtimes), the loader's cache, certificates, name
// resolution and time zones. Missing entries are skipped.
var DefaultRead = []string{
	"/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib",
	"/etc/ld.so.cache", "/etc/ssl", "/etc/ca-certificates", "/usr/share/ca-certificates",
	"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf",
	"/etc/localtime", "/usr/share/zoneinfo",
}

// StubPaths are shells the jail replaces with a stub that prints the
// jail's refusal and exits 126, so an agent's own shell tool fails with a
// message naming the jail instead of "not found". A path the operator
// allows with Config.Exec is not stubbed.
var StubPaths = []string{"/usr/bin/sh", "/usr/bin/bash", "/usr/bin/dash", "/usr/bin/zsh",
	"/bin/sh", "/bin/bash", "/bin/dash", "/bin/zsh"}

// StubExit is the stub's exit status (the shell's "cannot execute").
const StubExit = 126

// Errors; each names a failed check, and callers branch on them with
// errors.Is.
var (
	// ErrConfig: the jail's configuration or the agent's argv is unusable.
	ErrConfig = errors.New("jail: config")
	// ErrHidden: an allowlisted path would show something that must never be
	// visible (the custodian's state or keys, the computer's root).
	ErrHidden = errors.New("jail: path must stay hidden")
	// ErrPrivilege: the custodian lacks what the jail needs (root's
	// capabilities).
	ErrPrivilege = errors.New("jail: privilege")
	// ErrBwrap: bubblewrap is missing or not trustworthy.
	ErrBwrap = errors.New("jail: bubblewrap")
	// ErrLandlock: the kernel cannot enforce the exec allowlist.
	ErrLandlock = errors.New("jail: landlock")
	// ErrUserns: the kernel does not let an unprivileged user create a user
	// namespace, which bubblewrap needs.
	ErrUserns = errors.New("jail: user namespaces")
	// ErrStart: the jail could not be set up or started.
	ErrStart = errors.New("jail: start")
	// ErrSignal: the agent could not be asked to end (Terminate).
	ErrSignal = errors.New("jail: signal")
	// ErrCleanup: HOME or /tmp could not be emptied after the agent ended,
	// or its cgroup not removed.
	ErrCleanup = errors.New("jail: cleanup")
	// ErrUID: no uid for the agent: the range is used up, or the pinned uid
	// is in use by another live jail.
	ErrUID = errors.New("jail: uid")
	// ErrCgroup: the machine cannot hold the jail's memory and pids limits
	// (neither cgroup2 with the memory and pids controllers nor cgroup v1
	// memory and pids hierarchies), or the jail's cgroup could not be made.
	ErrCgroup = errors.New("jail: cgroup")
	// ErrUnsupported: not on Linux.
	ErrUnsupported = errors.New("jail: only Linux is supported")
)

// Validate checks the config's shape without reading files (Build reads
// and checks the paths).
func (c Config) Validate() error {
	if err := c.validateNetwork(); err != nil {
		return err
	}
	if (c.UID != nil && *c.UID == 0) || (c.GID != nil && *c.GID == 0) {
		return fmt.Errorf("%w: jail.uid and jail.gid must not be 0: the agent never runs as root", ErrConfig)
	}
	if c.GID != nil && c.UID == nil {
		return fmt.Errorf("%w: jail.gid without jail.uid: a uid drawn per jail comes with the same gid", ErrConfig)
	}
	if r := c.UIDRange; r != nil && (r.First == 0 || r.Last < r.First || r.Last >= 1<<31) {
		return fmt.Errorf("%w: jail.uid_range %d..%d: want 0 < first <= last < 2^31", ErrConfig, r.First, r.Last)
	}
	if c.MaxMemoryBytes != nil && *c.MaxMemoryBytes < MinMemory {
		return fmt.Errorf("%w: jail.max_memory_bytes %d is below %d", ErrConfig, *c.MaxMemoryBytes, MinMemory)
	}
	if c.MaxPids != nil && (*c.MaxPids < MinPids || *c.MaxPids > 1<<22) {
		return fmt.Errorf("%w: jail.max_pids %d: want %d to %d", ErrConfig, *c.MaxPids, MinPids, 1<<22)
	}
	switch c.Cgroup {
	case "", CgroupRequired, CgroupOff:
	default:
		return fmt.Errorf("%w: jail.cgroup %q: want %q or %q", ErrConfig, c.Cgroup, CgroupRequired, CgroupOff)
	}
	return nil
}

// validateNetwork checks jail.network, jail.egress and jail.egress_port.
func (c Config) validateNetwork() error {
	switch c.Network {
	case "", NetworkHost, NetworkNone, NetworkProxy:
	default:
		return fmt.Errorf("%w: jail.network %q: want %q, %q or %q", ErrConfig, c.Network, NetworkProxy, NetworkHost, NetworkNone)
	}
	if c.Network != NetworkProxy && (c.Egress != nil || c.EgressPort != 0) {
		return fmt.Errorf("%w: jail.egress and jail.egress_port need jail.network %q", ErrConfig, NetworkProxy)
	}
	if c.EgressPort < 0 || c.EgressPort > 65535 {
		return fmt.Errorf("%w: jail.egress_port %d: want 1 to 65535", ErrConfig, c.EgressPort)
	}
	if c.Egress != nil {
		if err := c.Egress.Validate(); err != nil {
			return fmt.Errorf("%w: jail.egress: %w", ErrConfig, err)
		}
	}
	return nil
}

// The smallest limits a jail accepts: below them not even the jail's own
// init and bwrap start.
const (
	MinMemory = 16 << 20
	MinPids   = 8
)
