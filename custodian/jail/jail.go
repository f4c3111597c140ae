// Package jail confines the agent process that `tether-custodian run`
// starts, so that whatever the agent does outside ACP (its own file tools,
// its own shell tool, a hook planted in a settings file) fails closed
// instead of reaching the host or the computer.
//
// The agent runs under bubblewrap (bwrap, unprivileged, in a new user,
// mount, pid, ipc and uts namespace) as an unprivileged uid with no
// capabilities and no_new_privs. Its mount view holds read-only system
// libraries, certificates, its runtime and what the operator allows; a
// private HOME and /tmp (noexec, on a tmpfs only the jail can see, emptied
// when it ends); and, at the tuple root's path, an empty read-only
// placeholder: the computer's files are never visible. A small init that
// runs inside the view (this package's HelperMain) applies a Landlock
// ruleset before it executes the agent, so exec is denied except for an
// allowlist, and signals and abstract unix sockets cannot leave the jail.
//
// Use: Build a Spec from a Config and the agent's argv, Start it, and Wait
// (which empties HOME and /tmp). A binary that starts jails must call
// HelperMain first thing in main: the init and the shell stubs inside the
// jail are that same binary.
package jail

import (
	"errors"
	"fmt"
)

// Network modes of Config.Network.
const (
	// NetworkHost keeps the host's network namespace: the agent reaches its
	// model, and also every service on the host's loopback.
	NetworkHost = "host"
	// NetworkNone gives the agent a network namespace of its own with only
	// a loopback interface: it reaches nothing outside the jail.
	NetworkNone = "none"
)

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
	// Network is NetworkHost (default) or NetworkNone.
	Network string `json:"network,omitempty"`
	// UID and GID run the agent; default DefaultID. 0 is refused.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	// Bwrap is bubblewrap's path; default DefaultBwrap.
	Bwrap string `json:"bwrap,omitempty"`
}

// Defaults.
const (
	// DefaultID is the agent's uid and gid unless configured: above the ids
	// a distribution assigns and below the range disposable computers draw
	// their grant ids from (60000 and up).
	DefaultID = 59999
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
	// ErrCleanup: HOME or /tmp could not be emptied after the agent ended.
	ErrCleanup = errors.New("jail: cleanup")
	// ErrUnsupported: not on Linux.
	ErrUnsupported = errors.New("jail: only Linux is supported")
)

// Validate checks the config's shape without reading files (Build reads
// and checks the paths).
func (c Config) Validate() error {
	switch c.Network {
	case "", NetworkHost, NetworkNone:
	default:
		return fmt.Errorf("%w: jail.network %q: want %q or %q", ErrConfig, c.Network, NetworkHost, NetworkNone)
	}
	if (c.UID != nil && *c.UID == 0) || (c.GID != nil && *c.GID == 0) {
		return fmt.Errorf("%w: jail.uid and jail.gid must not be 0: the agent never runs as root", ErrConfig)
	}
	return nil
}
