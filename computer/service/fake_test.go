package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/api"
)

// strictProv is the test provisioner. It fails the test on any call the
// service should never make (a machine used after Close, a grant after a
// withdrawal, a teardown out of order, Adopt or Destroy of a directory it
// never made, Prepare of a directory twice, Usage), and records every
// call in order as "Op dir".
type strictProv struct {
	t        *testing.T
	mu       sync.Mutex
	calls    []string
	machines map[string]*strictMachine // every machine ever made, by dir
	dead     map[string]bool           // Adopt fails: the receiver died
	failed   map[string]bool           // Prepare was called there and failed
	busy     atomic.Bool
	prepErr  error
	live     int // machines prepared and not yet closed or destroyed
	maxLive  int
	// wrap, when set, is what Prepare and Adopt hand out for a machine
	// (egress_test.go: a networked one).
	wrap func(*strictMachine) api.Machine
}

// handOut is m as Prepare and Adopt return it.
func (p *strictProv) handOut(m *strictMachine) api.Machine {
	if p.wrap != nil {
		return p.wrap(m)
	}
	return m
}

var _ api.Provisioner = (*strictProv)(nil)

func newStrictProv(t *testing.T) *strictProv {
	return &strictProv{t: t, machines: map[string]*strictMachine{}, dead: map[string]bool{}, failed: map[string]bool{}}
}

func (p *strictProv) record(op, dir string) {
	p.mu.Lock()
	p.calls = append(p.calls, op+" "+dir)
	p.mu.Unlock()
}

// callsFor returns the ops called on dir, in order.
func (p *strictProv) callsFor(dir string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, c := range p.calls {
		if op, d, _ := strings.Cut(c, " "); d == dir {
			out = append(out, op)
		}
	}
	return out
}

func (p *strictProv) count(op string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.calls {
		if strings.HasPrefix(c, op+" ") {
			n++
		}
	}
	return n
}

func (p *strictProv) allCalls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

func (p *strictProv) Prepare(ctx context.Context, dir string, l api.Limits) (api.Machine, error) {
	p.record("Prepare", dir)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.machines[dir] != nil || p.failed[dir] {
		p.t.Errorf("Prepare %s: the directory was prepared before (a machine reused)", dir)
	}
	if p.prepErr != nil {
		p.failed[dir] = true
		return nil, p.prepErr
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	m := &strictMachine{p: p, dir: dir, limits: l}
	p.machines[dir] = m
	p.live++
	p.maxLive = max(p.maxLive, p.live)
	return p.handOut(m), nil
}

func (p *strictProv) Adopt(ctx context.Context, dir string) (api.Machine, error) {
	p.record("Adopt", dir)
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.machines[dir]
	switch {
	case m == nil:
		p.t.Errorf("Adopt %s: no machine was made there", dir)
		return nil, errors.New("no machine")
	case m.closed || m.destroyed:
		p.t.Errorf("Adopt %s: the machine was closed", dir)
		return nil, errors.New("closed")
	case p.dead[dir]:
		return nil, fmt.Errorf("receiver of %s is not running", dir)
	}
	return p.handOut(m), nil
}

func (p *strictProv) Destroy(ctx context.Context, dir string) error {
	p.record("Destroy", dir)
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.machines[dir]
	if m == nil && p.failed[dir] {
		return nil
	}
	if m == nil {
		p.t.Errorf("Destroy %s: no machine was made there", dir)
		return nil
	}
	if !m.closed && !m.destroyed {
		p.live--
	}
	m.destroyed = true
	return os.RemoveAll(dir)
}

// strictMachine is one machine of strictProv.
type strictMachine struct {
	p      *strictProv
	dir    string
	limits api.Limits

	// Guarded by p.mu.
	grants            []time.Time
	withdrawn, killed bool
	frozen            bool
	closed, destroyed bool
}

// use records op and fails the test when the machine is gone.
func (m *strictMachine) use(op string) {
	m.p.record(op, m.dir)
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	if (m.closed && op != "Close") || m.destroyed {
		m.p.t.Errorf("%s %s after Close or Destroy", op, m.dir)
	}
}

func (m *strictMachine) Dir() string { return m.dir }

func (m *strictMachine) Tuple() admission.Tuple {
	return admission.Tuple{Owner: "o", Allocation: m.dir, Session: "s", Workspace: "w", Sandbox: "b",
		Generation: 1, Executor: "e", Site: "local", Root: "/work"}
}

func (m *strictMachine) Grant(ctx context.Context, notAfter time.Time) error {
	m.use("Grant")
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	if m.withdrawn {
		m.p.t.Errorf("Grant %s after Withdraw: a machine reused after release", m.dir)
	}
	m.grants = append(m.grants, notAfter)
	return nil
}

func (m *strictMachine) Withdraw(ctx context.Context) error {
	m.use("Withdraw")
	m.p.mu.Lock()
	m.withdrawn = true
	m.p.mu.Unlock()
	return nil
}

func (m *strictMachine) KillCommands(ctx context.Context) error {
	m.use("KillCommands")
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	if len(m.grants) > 0 && !m.withdrawn {
		m.p.t.Errorf("KillCommands %s before Withdraw", m.dir)
	}
	m.killed = true
	return nil
}

func (m *strictMachine) Freeze(ctx context.Context) error {
	m.use("Freeze")
	m.p.mu.Lock()
	m.frozen = true
	m.p.mu.Unlock()
	return nil
}

func (m *strictMachine) Thaw(ctx context.Context) error {
	m.use("Thaw")
	m.p.mu.Lock()
	m.frozen = false
	m.p.mu.Unlock()
	return nil
}

func (m *strictMachine) Usage(ctx context.Context) (api.Usage, error) {
	m.p.t.Errorf("Usage %s: the service does not read usage", m.dir)
	return api.Usage{}, errors.New("unexpected")
}

func (m *strictMachine) Busy(ctx context.Context) (bool, error) {
	m.use("Busy")
	return m.p.busy.Load(), nil
}

func (m *strictMachine) CustodianConfig() string { return m.dir + "/custodian.json" }

func (m *strictMachine) ReceiverAlive() bool {
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	return !m.p.dead[m.dir]
}

func (m *strictMachine) Close(ctx context.Context) error {
	m.use("Close")
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	if len(m.grants) > 0 && (!m.withdrawn || !m.killed) {
		m.p.t.Errorf("Close %s before Withdraw and KillCommands", m.dir)
	}
	if !m.closed && !m.destroyed {
		m.p.live--
	}
	m.closed = true
	return os.RemoveAll(m.dir)
}
