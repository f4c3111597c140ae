package receiver

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/receiver/fsops"
	"github.com/tetherdev/tether/receiver/spawn"
)

// Landlock modes of LandlockConfig.
const (
	// LandlockOff starts children without Landlock.
	LandlockOff = "off"
	// LandlockRequired confines every child to its grant root plus the
	// configured system paths, and refuses to start (the daemon) or to
	// spawn (a child) when the kernel cannot enforce it: no downgrade.
	LandlockRequired = "required"
)

// LandlockConfig says whether and how children are confined.
type LandlockConfig struct {
	// Mode is LandlockOff or LandlockRequired; "" means off.
	Mode string `json:"mode"`
	// ReadExec lists paths children may read and execute beneath; nil
	// means DefaultLandlockReadExec. Missing paths are skipped.
	ReadExec []string `json:"read_exec,omitempty"`
	// ReadWrite lists files (devices) or directories children may read
	// and write beneath, besides their grant root; nil means
	// DefaultLandlockReadWrite. Missing paths are skipped.
	ReadWrite []string `json:"read_write,omitempty"`
	// Writable lists directories children get every right beneath, as
	// they have beneath their grant root: a computer's private /tmp,
	// /var/tmp, /dev/shm and home. None by default; missing paths are
	// skipped.
	Writable []string `json:"writable,omitempty"`
	// TCP is TCPPorts ("" too) or TCPAny.
	TCP string `json:"tcp,omitempty"`
	// TCPBind and TCPConnect list the TCP ports children may bind and
	// connect to (any address). Every other TCP bind and connect is
	// refused: none by default. Only with TCPPorts.
	TCPBind    []uint16 `json:"tcp_bind,omitempty"`
	TCPConnect []uint16 `json:"tcp_connect,omitempty"`
}

// TCP policies of LandlockConfig.
const (
	// TCPPorts confines TCP bind and connect to the listed ports: the
	// default.
	TCPPorts = "ports"
	// TCPAny leaves TCP to the network namespace: Landlock does not
	// handle TCP bind and connect. Meant only for a receiver whose
	// network namespace has nothing but its own loopback (a namespaced
	// computer), where the port rules would protect nothing.
	TCPAny = "any"
)

// validate checks that every writable directory is an absolute clean
// path and the TCP policy against the port lists.
func (c LandlockConfig) validate() error {
	for _, w := range c.Writable {
		if !absClean(w) || w == "/" {
			return fmt.Errorf("writable %q is not an absolute clean path below /", w)
		}
	}
	switch c.TCP {
	case "", TCPPorts:
	case TCPAny:
		if len(c.TCPBind)+len(c.TCPConnect) > 0 {
			return fmt.Errorf("tcp %q allows every port; tcp_bind and tcp_connect must be empty", TCPAny)
		}
	default:
		return fmt.Errorf("tcp must be %q or %q, not %q", TCPPorts, TCPAny, c.TCP)
	}
	return nil
}

// Defaults of LandlockConfig.
var (
	DefaultLandlockReadExec  = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/proc", "/dev/urandom", "/dev/random"}
	DefaultLandlockReadWrite = []string{"/dev/null", "/dev/zero", "/dev/full"}
)

// landlockRules holds the system paths opened once and the allowed TCP
// ports (or that TCP is not handled); nil means off.
type landlockRules struct {
	rules  []spawn.Rule
	ports  []spawn.PortRule
	anyTCP bool
}

func newLandlockRules(c LandlockConfig) (*landlockRules, error) {
	switch c.Mode {
	case "", LandlockOff:
		return nil, nil
	case LandlockRequired:
	default:
		return nil, fmt.Errorf("%w: landlock mode %q is not %q or %q", ErrOptions, c.Mode, LandlockOff, LandlockRequired)
	}
	if abi := spawn.LandlockABI(); abi < spawn.MinLandlockABI {
		return nil, fmt.Errorf("%w: landlock required but the kernel's ABI is %d (need %d)", spawn.ErrLandlock, abi, spawn.MinLandlockABI)
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%w: landlock: %w", ErrOptions, err)
	}
	ro, rw := c.ReadExec, c.ReadWrite
	if ro == nil {
		ro = DefaultLandlockReadExec
	}
	if rw == nil {
		rw = DefaultLandlockReadWrite
	}
	lr := &landlockRules{ports: portRules(c.TCPBind, c.TCPConnect), anyTCP: c.TCP == TCPAny}
	for _, set := range []struct {
		paths  []string
		access spawn.Access
	}{{ro, spawn.AccessReadExec}, {rw, spawn.AccessReadWriteFile | spawn.AccessReadExec}, {c.Writable, spawn.AccessAll}} {
		if err := lr.open(set.paths, set.access); err != nil {
			lr.close()
			return nil, err
		}
	}
	return lr, nil
}

// portRules merges the bind and connect lists into one rule per port.
func portRules(bind, connect []uint16) []spawn.PortRule {
	access := map[uint16]spawn.NetAccess{}
	var order []uint16
	for _, l := range []struct {
		ports  []uint16
		access spawn.NetAccess
	}{{bind, spawn.NetBindTCP}, {connect, spawn.NetConnectTCP}} {
		for _, p := range l.ports {
			if access[p] == 0 {
				order = append(order, p)
			}
			access[p] |= l.access
		}
	}
	out := make([]spawn.PortRule, 0, len(order))
	for _, p := range order {
		out = append(out, spawn.PortRule{Port: p, Access: access[p]})
	}
	return out
}

func (lr *landlockRules) open(paths []string, access spawn.Access) error {
	for _, p := range paths {
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: landlock path %s: %w", ErrOptions, p, err)
		}
		lr.rules = append(lr.rules, spawn.Rule{File: f, Access: access})
	}
	return nil
}

// rulesetFor builds the ruleset of one child: the system rules plus its
// grant root with every right. nil (no Landlock) when off.
func (lr *landlockRules) rulesetFor(root *fsops.Root) (*spawn.Ruleset, error) {
	if lr == nil {
		return nil, nil
	}
	dir, err := root.OpenDir("")
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	rules := append(lr.rules[:len(lr.rules):len(lr.rules)], spawn.Rule{File: dir, Access: spawn.AccessAll})
	if lr.anyTCP {
		return spawn.NewRulesetAnyTCP(rules)
	}
	return spawn.NewRuleset(rules, lr.ports...)
}

func (lr *landlockRules) close() {
	if lr == nil {
		return
	}
	for _, r := range lr.rules {
		r.File.Close()
	}
}
