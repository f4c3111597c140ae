package provision

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/tetherdev/tether/receiver/cgroup2"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/syndtr/gocapability/capability"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/bins"
	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/receiver/spawn"
)

// Transports a Local computer can serve.
const (
	// TransportTLS is mutual TLS 1.3 pinned to the computer's own CA
	// (the default): over the unix socket DIR/run/receiver.sock on a
	// namespaced computer, over TCP on loopback with IsolationOff.
	TransportTLS = "tls"
	// TransportUnix is a host-only unix socket whose peers are limited to
	// root and the custodian's uid, without TLS.
	TransportUnix = "unix"
)

// Landlock modes; see Options.Landlock.
const (
	LandlockAuto     = ""
	LandlockRequired = "required"
	LandlockOff      = "off"
)

// Options say what to allocate. Only Dir and Bins are required.
type Options struct {
	// Dir is where the computer lives. It must not exist, or be an empty
	// directory; every directory above it must be traversable by others
	// (the grant's uid reaches its root through them).
	Dir string
	// Bins holds tether-receiver.
	Bins bins.Set
	// Owner is the tuple's owner, the principal that may bind it
	// (default "alice").
	Owner string
	// Ops the grant allows (default: all five).
	Ops []admission.Op
	// Limits of the grant (zero fields take DefaultLimits' values; on a
	// computer with IsolationNamespaces zero resource limits take
	// DefaultResources' values, and the computer enforces them).
	Limits admission.Limits
	// Isolation is IsolationNamespaces (the default: the receiver in its
	// own mount, PID, network, IPC and UTS namespaces, reached through a
	// unix socket in Dir, with the grant's resource limits enforced) or
	// IsolationOff (today's computer, for comparison).
	Isolation string
	// Lease is how long the grant lasts from now (default one hour).
	Lease time.Duration
	// CustodianUID and CustodianGID own the custodian's credential files,
	// configuration and state directory (default: the caller's, root).
	CustodianUID, CustodianGID *uint32
	// DropCaps names capabilities removed from the receiver's bounding
	// set before it starts ("KILL"): a reduced worker. The receiver
	// refuses to start without any of its seven, so New then fails with
	// an *ExitError naming it.
	DropCaps []string
	// Transport is TransportTLS (default) or TransportUnix.
	Transport string
	// Landlock confines children: LandlockAuto (required when the
	// kernel supports it, else off), LandlockRequired or LandlockOff.
	Landlock string
	// Cgroup contains each command in its own cgroup, killed whole with
	// cgroup.kill: CgroupAuto (required when a writable cgroup2 mount
	// where a child cgroup has cgroup.kill exists, else off),
	// CgroupRequired (New refuses, naming the failed check, without
	// one) or CgroupOff. With required the computer makes its parent
	// cgroup <mount>/tether-<sandbox> and Close removes it.
	Cgroup string
	// FindCgroup2 returns the cgroup2 mount the computer's parent cgroup
	// goes in; nil means cgroup2.Mount (this process's mountinfo).
	FindCgroup2 func() (string, error)
	// Detach starts the receiver in its own session, outliving the
	// caller (tether-demo up); Attach and Down find it again.
	Detach bool
	// Log, if set, also receives the receiver's log lines as written.
	Log io.Writer
	// NoGrant makes a computer that admits nothing yet: its first
	// snapshot holds no grant (ending Lease from now) and DIR/custodian.json
	// is written by the first GrantUntil. The warm pool's state.
	NoGrant bool
	// seccompOff starts the receiver with seccomp off: only for the
	// positive control of TestIntegrationAttackUserNamespace (a computer
	// tether makes always requires it).
	seccompOff bool
}

// DefaultLimits are the grant limits a zero Options.Limits field takes.
var DefaultLimits = admission.Limits{MaxProcs: 64, MaxRuntimeS: 600, MaxOutputBytes: 1 << 20, MaxFileBytes: 64 << 20}

// AllOps is the default set of grant ops.
var AllOps = []admission.Op{admission.OpRead, admission.OpWrite, admission.OpList, admission.OpExec, admission.OpKill}

// Local is a computer whose receiver is a root process on this machine,
// confining its children to a directory with a fresh uid and gid (and
// Landlock where the kernel has it).
type Local struct {
	opts  Options
	paths paths
	drop  []capability.Cap

	creds       *Credentials
	grants      *Grants
	landlock    string
	cgroupMount string // the cgroup2 mount, with CgroupRequired

	saveMu     sync.Mutex // held while the state file is written
	mu         sync.Mutex
	state      State
	recv       *receiverProc          // nil when stopped
	serviceRef *custodian.ComputerRef // written into custodian.json (SetServiceRef)

	egressProxy bool // the grant's env points at the egress proxy (egress.go); guarded by mu

	closeOnce sync.Once
	closeErr  error

	spec *os.File // the stage's spec pipe until it is written (prepare.go)
}

// New allocates a computer and starts its receiver. On failure everything
// it made is removed again; the error names the failed step. A receiver
// that refuses to start (a reduced worker) gives an *ExitError.
func New(ctx context.Context, opts Options) (*Local, error) {
	c := &Local{opts: opts}
	err := RunSteps(ctx, "computer", []Step{
		{Name: "validate.Options", Run: c.validate},
		{Name: "allocate.IDs", Run: c.allocateIDs},
		// The state file first, alone in DIR: a process killed after it
		// leaves what Destroy can read, and one killed before it leaves
		// at most an empty DIR (Destroy removes it).
		{Name: "layout.Dir", Run: c.makeDir},
		{Name: "state.Early", Run: c.saveState},
		{Name: "layout.Directories", Run: c.makeLayout},
		{Name: "cgroup.Parent", Run: c.makeCgroupParent},
		{Name: "limits.Cgroups", Run: c.makeLimitCgroups},
		{Name: "disk.Root", Run: c.makeDisk},
		{Name: "pki.Certificates", Run: c.makePKI},
		{Name: "admission.Key", Run: c.makeSigningKey},
		{Name: "admission.Publish", Run: c.publishInitial},
		{Name: "custodian.Files", Run: c.writeCustodianFiles},
		{Name: "receiver.Config", Run: c.writeReceiverConfig},
		{Name: "state.Save", Run: c.saveState},
		{Name: "receiver.Start", Run: c.startReceiver},
	}, c.teardown, 20*time.Second)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Local) validate(context.Context) error {
	o := &c.opts
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: the receiver must run as root (effective uid is %d)", ErrOptions, os.Geteuid())
	}
	if err := o.Defaults(); err != nil {
		return err
	}
	switch o.Transport {
	case "":
		o.Transport = TransportTLS
	case TransportTLS, TransportUnix:
	default:
		return fmt.Errorf("%w: transport %q is not %q or %q", ErrOptions, o.Transport, TransportTLS, TransportUnix)
	}
	var err error
	if c.state.Isolation, err = chooseIsolation(o.Isolation); err != nil {
		return err
	}
	if c.state.namespaced() {
		if c.state.Resources, err = resources(o.Limits); err != nil {
			return err
		}
	}
	c.landlock, err = ChooseLandlock(o.Landlock, func() bool { return spawn.LandlockABI() >= spawn.MinLandlockABI })
	if err != nil {
		return err
	}
	if c.state.Cgroup, err = ChooseCgroup(o.Cgroup, c.findCgroup); err != nil {
		return err
	}
	for _, n := range o.DropCaps {
		cp, err := capByName(n)
		if err != nil {
			return err
		}
		c.drop = append(c.drop, cp)
	}
	dir, err := CheckDir(o.Dir)
	if err != nil {
		return err
	}
	c.paths = layout(dir)
	return nil
}

func (c *Local) allocateIDs(context.Context) error {
	a, err := Allocate(c.opts, "local", "local", c.paths.root)
	if err != nil {
		return err
	}
	c.state = State{Version: stateVersion, Dir: c.paths.dir, UID: a.UID, GID: a.GID,
		CustodianUID: a.CustodianUID, CustodianGID: a.CustodianGID, Transport: c.opts.Transport, Landlock: c.landlock,
		Cgroup: c.state.Cgroup, Tuple: a.Tuple, Isolation: c.state.Isolation, Resources: c.state.Resources}
	if c.landlock == LandlockRequired {
		c.state.LandlockABI = spawn.LandlockABI()
	}
	switch {
	case c.state.namespaced() || c.opts.Transport == TransportUnix:
		c.state.Socket = c.paths.socket
	default:
		c.state.Address, err = FreeLoopbackAddress()
	}
	return err
}

// findCgroup finds the cgroup2 mount and checks that it can hold the
// computer's cgroups; ChooseCgroup asks it.
func (c *Local) findCgroup() error {
	find := c.opts.FindCgroup2
	if find == nil {
		find = cgroup2.Mount
	}
	mount, err := find()
	if err != nil {
		return err
	}
	if err := cgroup2.Check(mount); err != nil {
		return fmt.Errorf("cgroup2 mount %s: %w", mount, err)
	}
	c.cgroupMount = mount
	return nil
}

// makeCgroupParent creates the parent cgroup of the receiver's command
// cgroups, with CgroupRequired, and records it in the state.
func (c *Local) makeCgroupParent(ctx context.Context) error {
	if c.state.Cgroup != CgroupRequired {
		return nil
	}
	p := filepath.Join(c.cgroupMount, CgroupParentName(c.state.Tuple.Sandbox))
	err := c.makeRecordedCgroup(ctx, p, func(s *State, made bool) {
		if s.CgroupParent = ""; made {
			s.CgroupParent = p
		}
	})
	if err != nil {
		return fmt.Errorf("create the parent cgroup: %w", err)
	}
	return nil
}

// grantFor returns the grant of the tuple ending at notAfter, with the
// resource limits the computer enforces.
func (c *Local) grantFor(notAfter time.Time) admission.Grant {
	g := c.opts.GrantFor(c.state.Tuple, c.state.UID, c.state.GID, notAfter)
	r := c.state.Resources
	g.Limits.MaxPids, g.Limits.MaxMemoryBytes, g.Limits.MaxDiskBytes = r.MaxPids, r.MaxMemoryBytes, r.MaxDiskBytes
	g.Limits.MaxOpenFiles, g.Limits.MaxFileSizeBytes = r.MaxOpenFiles, r.MaxFileSizeBytes
	return c.withProxyEnv(g)
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// Dir is the directory the computer lives in.
func (c *Local) Dir() string { return c.paths.dir }

// State returns what the computer's state file records.
func (c *Local) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// Cgroup is the receiver's cgroup mode: CgroupRequired (commands
// contained in cgroups under State().CgroupParent) or CgroupOff.
func (c *Local) Cgroup() string { return c.State().Cgroup }

// Tuple implements Computer.
func (c *Local) Tuple() admission.Tuple { return c.state.Tuple }

// Grant implements Computer.
func (c *Local) Grant() admission.Grant { return c.grants.Current() }

// CustodianConfigPath is DIR/custodian.json, a ready configuration for
// `tether-custodian run --config`.
func (c *Local) CustodianConfigPath() string { return c.paths.custodianConfig }

// AuditPublicKey is the note verifier key of the custodian's audit
// checkpoints, for `tether-custodian audit verify --pubkey`.
func (c *Local) AuditPublicKey() string { return c.paths.auditPub }

// ReceiverLog returns the receiver's log so far.
func (c *Local) ReceiverLog() string { return tail(c.paths.receiverLog, 1<<20) }
