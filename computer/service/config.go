package service

import (
	"errors"
	"log"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// Defaults the service applies where Config leaves a field zero.
const (
	DefaultLeaseTTL     = time.Hour
	DefaultMaxLeaseTTL  = 24 * time.Hour
	DefaultIdleTimeout  = 900 * time.Second
	DefaultQueueTimeout = time.Minute
	MaxQueueTimeout     = time.Hour
	DefaultIdleCheck    = time.Second
	// Ceilings of one computer's limits where Config.MaxLimits leaves
	// one zero: beyond them a request is malformed, whatever the host.
	DefaultMaxMemoryBytes = 256 << 30
	DefaultMaxPids        = 1 << 22 // the kernel's largest pid_max
	DefaultMaxDiskBytes   = 16 << 40
	maxLabels             = 32
	maxLabelKey           = 63
	maxLabelValue         = 255
)

// Profile is a named api.Limits with the number of machines the warm
// pool keeps ready for it. A create whose limits (after defaults) equal a
// profile's claims one of its machines.
type Profile struct {
	Name   string
	Limits api.Limits
	Size   int
}

// Config is the service's configuration. Dir and Provisioner are
// required; a zero limit means "no limit", a zero duration its default.
type Config struct {
	// Dir holds state.db (bbolt), transitions.log and the machines'
	// directories (computers/<id>, pool/<name>).
	Dir         string
	Provisioner api.Provisioner
	// Provisioners are the other tiers' provisioners, by the tier a
	// create names (api.TierVM); Provisioner serves the default tier,
	// api.TierNamespaced. The warm pool holds default-tier machines only.
	Provisioners map[string]api.Provisioner
	// Socket is the unix socket the daemon serves the API on; machines
	// name it to their custodian (api.Referrer). Empty names none.
	Socket string

	DefaultLeaseTTL time.Duration
	MaxLeaseTTL     time.Duration
	IdleTimeout     time.Duration // default idle timeout of a computer
	QueueTimeout    time.Duration // default wait in the queue
	// IdleCheck is how often each running computer's activity is read.
	IdleCheck time.Duration

	DefaultLimits api.Limits
	// MaxLimits are the ceilings of one computer's limits (zero: the
	// DefaultMax constants).
	MaxLimits api.Limits

	MaxComputers   int   // computers at once, pool machines included
	MaxMemoryBytes int64 // sum of committed limits.memory_bytes, pool included
	OwnerQuota     int   // computers one owner may have (queued included)

	Pools []Profile

	// Egress is the host's egress proxy; nil: the service gives no
	// egress (a computer has its loopback only). EgressPresets are the
	// preset names its configuration holds, which a policy may name.
	Egress        api.Egress
	EgressPresets []string

	// Logf reports what no caller is told (a pool machine that failed;
	// default log.Printf).
	Logf func(format string, args ...any)

	// OnDenied is called (from the request's goroutine) each time a
	// caller names a computer of another owner; the server audits it.
	// The caller is answered not_found either way.
	OnDenied func(c api.Caller, id string)

	// StepHook, when set, is called at each named step of an operation
	// (the Step constants), from the goroutine doing it and holding the
	// computer's lock. It is a test hook: `tether-computer serve` sets it
	// only from TETHER_COMPUTER_TEST_PAUSE, to block at one step so that a
	// fault test can SIGKILL the daemon exactly there.
	StepHook func(step string)
}

// Named steps StepHook sees.
const (
	StepCreateRecorded  = "create.recorded"  // creating is recorded; Prepare not yet called
	StepCreatePrepared  = "create.prepared"  // the machine is made; no grant, running not recorded
	StepEndRecorded     = "end.recorded"     // expiring is recorded; nothing withdrawn yet
	StepEndWithdrawn    = "end.withdrawn"    // the grant is withdrawn; commands not yet killed
	StepEndKilled       = "end.killed"       // commands are killed; the machine not yet closed
	StepSuspendRecorded = "suspend.recorded" // suspended is recorded; not yet frozen
)

// step calls the StepHook, if any.
func (c *Config) step(name string) {
	if c.StepHook != nil {
		c.StepHook(name)
	}
}

func (c *Config) applyDefaults() error {
	if c.Dir == "" || c.Provisioner == nil {
		return errors.New("service: Config needs Dir and Provisioner")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Logf == nil {
		c.Logf = log.Printf
	}
	def(&c.MaxLeaseTTL, DefaultMaxLeaseTTL)
	def(&c.DefaultLeaseTTL, min(DefaultLeaseTTL, c.MaxLeaseTTL))
	def(&c.IdleTimeout, DefaultIdleTimeout)
	def(&c.QueueTimeout, DefaultQueueTimeout)
	def(&c.IdleCheck, DefaultIdleCheck)
	if c.DefaultLeaseTTL > c.MaxLeaseTTL {
		return errors.New("service: DefaultLeaseTTL over MaxLeaseTTL")
	}
	c.MaxLimits = withDefaults(c.MaxLimits, api.Limits{MemoryBytes: DefaultMaxMemoryBytes, Pids: DefaultMaxPids,
		DiskBytes: DefaultMaxDiskBytes})
	for i := range c.Pools {
		c.Pools[i].Limits = withDefaults(c.Pools[i].Limits, c.DefaultLimits)
	}
	return nil
}

func withDefaults(l, def api.Limits) api.Limits {
	if l.MemoryBytes == 0 {
		l.MemoryBytes = def.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = def.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = def.DiskBytes
	}
	return l
}
