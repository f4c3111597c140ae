package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/custodian"
)

// Machine is one computer the Provisioner made or adopted
// (api.Machine). Its methods may be called from several goroutines;
// Close must be called.
type Machine struct {
	l *Local

	closeOnce sync.Once
	closeErr  error
}

var _ api.Machine = (*Machine)(nil)

// Local returns the computer behind m.
func (m *Machine) Local() *Local { return m.l }

// Dir implements api.Machine.
func (m *Machine) Dir() string { return m.l.Dir() }

// Tuple implements api.Machine.
func (m *Machine) Tuple() admission.Tuple { return m.l.Tuple() }

// Grant implements api.Machine (Local.GrantUntil).
func (m *Machine) Grant(ctx context.Context, notAfter time.Time) error {
	return m.l.GrantUntil(ctx, notAfter)
}

// Withdraw implements api.Machine: a snapshot without the grant, so the
// receiver refuses the tuple (not_admitted) from its next request.
func (m *Machine) Withdraw(ctx context.Context) error {
	_, err := m.l.Publish(ctx, time.Time{})
	return err
}

// KillCommands implements api.Machine (Local.KillCommands).
func (m *Machine) KillCommands(ctx context.Context) error { return m.l.KillCommands(ctx) }

// Freeze implements api.Machine (Local.Freeze).
func (m *Machine) Freeze(ctx context.Context) error { return m.l.Freeze(ctx) }

// Thaw implements api.Machine (Local.Thaw).
func (m *Machine) Thaw(ctx context.Context) error { return m.l.Thaw(ctx) }

// Usage implements api.Machine (Local.Usage).
func (m *Machine) Usage(context.Context) (api.Usage, error) { return m.l.Usage() }

// Busy implements api.Machine: whether any process runs as the grant's
// uid.
func (m *Machine) Busy(context.Context) (bool, error) {
	s := m.l.State()
	// The commands' pids.current is one file read; the service asks every
	// computer each second, and a scan of /proc per computer grows with
	// the fleet (80 s a pass at 1,000 computers).
	if n, err := s.counter("pids.current", "pids.current"); err == nil {
		return n > 0, nil
	}
	ps, err := ProcessesOf(s.UID)
	return len(ps) > 0, err
}

// CustodianConfig implements api.Machine: DIR/custodian.json, written by
// the first Grant.
func (m *Machine) CustodianConfig() string { return m.l.CustodianConfigPath() }

// ReceiverAlive implements api.Machine.
func (m *Machine) ReceiverAlive() bool { return m.l.ReceiverRunning() }

// Close implements api.Machine: Local.Close, then NothingLeft. The
// second call returns the first one's result.
func (m *Machine) Close(ctx context.Context) error {
	m.closeOnce.Do(func() {
		s := m.l.State()
		m.closeErr = errors.Join(m.l.Close(ctx), NothingLeft(s))
	})
	return m.closeErr
}

// GrantUntil publishes a snapshot holding the computer's grant ending at
// notAfter and rewrites DIR/custodian.json for that lease. It returns
// once both are in place.
func (c *Local) GrantUntil(ctx context.Context, notAfter time.Time) error {
	g := c.grantFor(notAfter)
	if _, err := c.Publish(ctx, time.Time{}, g); err != nil {
		return err
	}
	return c.writeCustodianConfig(g.NotAfter)
}

// KillCommands kills every process running as the computer's uid and
// returns once none is left; the receiver keeps running. On a frozen
// computer the commands are thawed after the SIGKILL, so that they die
// without running again (a frozen v1 task does not act on a signal), and
// frozen again once they are gone.
func (c *Local) KillCommands(ctx context.Context) error {
	s := c.State()
	if s.UID < MinID {
		return fmt.Errorf("%w: uid %d is not a computer's", ErrOptions, s.UID)
	}
	frozen, thawed := s.isFrozen(), false
	for {
		ps, err := pidsOf(s.UID, false)
		if err != nil {
			return err
		}
		if len(ps) == 0 {
			break
		}
		for _, p := range ps {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if frozen && !thawed {
			if err := s.setFrozen(ctx, false); err != nil {
				return err
			}
			thawed = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("computer: %d processes of uid %d survive SIGKILL: %w", len(ps), s.UID, context.Cause(ctx))
		case <-time.After(5 * time.Millisecond):
		}
	}
	if thawed {
		return s.setFrozen(ctx, true)
	}
	return nil
}

var _ api.Rooted = (*Machine)(nil)

// Root implements api.Rooted: DIR/root (the disk's project directory is
// bound there) and the grant's uid and gid.
func (m *Machine) Root() (dir string, uid, gid int) {
	s := m.l.State()
	return m.l.paths.root, int(s.UID), int(s.GID)
}

var _ api.RecordKeeper = (*Machine)(nil)

// KeepRecords implements api.RecordKeeper: it moves the custodian's state
// (op keys, receipts, the audit log) and the audit log's public key from
// DIR/custodian into dst, which it creates (mode 0700); a computer no
// custodian ever used has no state, and dst then holds the key only.
func (m *Machine) KeepRecords(_ context.Context, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("keep records: %w", err)
	}
	p := m.l.paths
	for _, mv := range []struct{ from, to string }{
		{p.custState, filepath.Join(dst, "state")},
		{p.auditPub, filepath.Join(dst, "audit.pub")},
	} {
		if err := os.Rename(mv.from, mv.to); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("keep records: %w", err)
		}
	}
	return atomicfile.SyncDir(dst)
}

var _ api.Referrer = (*Machine)(nil)

// SetServiceRef implements api.Referrer: the custodian configuration the
// next Grant writes names the service (custodian.Config.Computer).
func (m *Machine) SetServiceRef(ref api.ServiceRef) {
	m.l.mu.Lock()
	defer m.l.mu.Unlock()
	m.l.serviceRef = &custodian.ComputerRef{Socket: ref.Socket, ID: ref.ID}
}
