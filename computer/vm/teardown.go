package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tetherdev/tether/computer/vm/ctl"
)

// powerOffWait bounds the wait for QEMU to exit after the guest was
// asked to shut down.
const powerOffWait = 20 * time.Second

// Close implements api.Machine: the guest stops its receiver and powers
// off (QEMU is killed if it does not), the relay and the link close,
// QEMU's cgroups are emptied and removed, and the directory goes; then
// NothingLeft proves it. The second call returns the first's result.
func (m *Machine) Close(ctx context.Context) error {
	m.closeOnce.Do(func() {
		err := m.teardown(ctx)
		m.closeErr = errors.Join(err, m.nothingLeft())
	})
	return m.closeErr
}

func (m *Machine) teardown(ctx context.Context) error {
	var errs []error
	if m.relay != nil {
		m.relay.Close()
	}
	if m.ctl != nil && m.isFrozen() && m.alive() {
		_ = m.Thaw(ctx) // through the view while it serves: it records the resume
	}
	m.stopScreen()
	if m.ctl != nil && m.isFrozen() && m.alive() { // the view's resume failed: QMP cont
		_ = m.Thaw(ctx) // a stopped guest cannot shut down
	}
	if m.ctl != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if _, err := m.ctl.Call(sctx, ctl.Request{Op: ctl.OpShutdown}); err != nil && m.alive() {
			errs = append(errs, fmt.Errorf("guest shutdown: %w", err))
		}
		cancel()
		m.ctl.Close()
	}
	if m.vm != nil {
		select {
		case <-m.vm.Done():
		case <-time.After(powerOffWait):
		}
		m.vm.Close()
	}
	if m.wireConn != nil {
		m.wireConn.Close()
	}
	m.releaseCID()
	if m.relay != nil {
		m.relay.wg.Wait()
	}
	if m.cg.name != "" {
		errs = append(errs, m.cg.remove(context.WithoutCancel(ctx)))
	}
	if m.paths.dir != "" {
		errs = append(errs, os.RemoveAll(m.paths.dir))
	}
	return errors.Join(errs...)
}

func (m *Machine) alive() bool {
	if m.vm == nil {
		return false
	}
	select {
	case <-m.vm.Done():
		return false
	default:
		return true
	}
}

// nothingLeft proves the computer is gone: no directory (and so no
// socket or image), no cgroup, no QEMU process.
func (m *Machine) nothingLeft() error {
	return nothingLeft(m.paths.dir, m.cg, m.qemuPID())
}

func (m *Machine) qemuPID() int {
	if m.vm == nil {
		return 0
	}
	return m.vm.PID()
}

func nothingLeft(dir string, cg cgroups, pid int) error {
	var left []string
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		left = append(left, dir)
	}
	for _, h := range hierarchies {
		if cg.name == "" {
			break
		}
		if _, err := os.Lstat(cg.dir(h)); !errors.Is(err, os.ErrNotExist) {
			left = append(left, cg.dir(h))
		}
	}
	if pid > 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && !zombieOrGone(pid) {
			left = append(left, fmt.Sprintf("QEMU pid %d", pid))
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("%w: %v", ErrLeftover, left)
	}
	return nil
}

// zombieOrGone: pid has exited (a zombie nobody reaped yet counts).
func zombieOrGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ')' {
			return i+2 < len(s) && s[i+2] == 'Z'
		}
	}
	return false
}
