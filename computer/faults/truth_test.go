package faults

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/receiver/wire"
)

// checkRecordsTrue reads every computer the daemon lists and checks the
// host agrees: a running one's receiver runs a command, a suspended one
// is frozen and its receiver answers, a deleted or failed one has no
// directory, and none is left in a state between two. It returns the
// directories of the running and suspended ones.
func checkRecordsTrue(ctx context.Context, t *testing.T, e *env) map[string]bool {
	t.Helper()
	e.seen.scan()
	cs, err := e.cl.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	live := map[string]bool{}
	for _, c := range cs {
		switch c.State {
		case api.StateRunning, api.StateSuspended:
			if dir := checkMade(ctx, t, e, c); dir != "" {
				live[dir] = true
			}
		case api.StateDeleted, api.StateFailed:
			checkGone(t, e, c)
		default:
			t.Errorf("computer %s is still %s after the restart", c.ID, c.State)
		}
	}
	return live
}

// checkMade checks a running or suspended computer on the host and
// returns its directory.
func checkMade(ctx context.Context, t *testing.T, e *env, c api.Computer) string {
	t.Helper()
	if c.Tuple == nil {
		t.Errorf("%s is %s without a tuple", c.ID, c.State)
		return ""
	}
	st, ok := e.seen.bySandbox(c.Tuple.Sandbox)
	if !ok {
		t.Errorf("%s is %s, but no computer of sandbox %s is in the state directory", c.ID, c.State, c.Tuple.Sandbox)
		return ""
	}
	m := adopt(ctx, t, e, st.Dir)
	if m == nil {
		return st.Dir
	}
	if frozen := m.Local().Frozen(); frozen != (c.State == api.StateSuspended) {
		t.Errorf("%s is recorded %s, but its freezer says frozen=%v", c.ID, c.State, frozen)
	}
	if c.State == api.StateRunning {
		if out := runCommand(ctx, t, m, "echo alive-$((6*7))"); !strings.Contains(out, "alive-42") {
			t.Errorf("%s is recorded running, but a command printed %q", c.ID, out)
		}
	} else if _, err := provision.AttachVia(ctx, m.Local(), m.Tuple()); err != nil {
		t.Errorf("%s is recorded suspended, but its receiver does not answer an attach: %v", c.ID, err)
	}
	return st.Dir
}

// checkGone checks that an ended computer has no directory.
func checkGone(t *testing.T, e *env, c api.Computer) {
	t.Helper()
	dirs := []string{filepath.Join(e.state(), "computers", c.ID)}
	if c.Tuple != nil {
		if st, ok := e.seen.bySandbox(c.Tuple.Sandbox); ok {
			dirs = append(dirs, st.Dir)
		}
	}
	for _, d := range dirs {
		if _, err := os.Lstat(d); err == nil || !os.IsNotExist(err) {
			t.Errorf("%s is recorded %s (%s), but %s is there (%v)", c.ID, c.State, c.Reason, d, err)
		}
	}
}

// adopt reads the machine in dir as the daemon would (the provisioner's
// Adopt changes nothing); nil (and the test failed) when it cannot.
func adopt(ctx context.Context, t *testing.T, e *env, dir string) *provision.Machine {
	t.Helper()
	m, err := provision.NewProvisioner(provision.Config{Bins: e.b}).Adopt(ctx, dir)
	if err != nil {
		t.Errorf("adopt %s: %v", dir, err)
		return nil
	}
	return m.(*provision.Machine)
}

// runCommand runs a shell script in m as the custodian would (a wire
// client with the custodian's credentials) and returns its output.
func runCommand(ctx context.Context, t *testing.T, m *provision.Machine, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	id, wc := startCommand(ctx, t, m, script)
	if wc == nil {
		return ""
	}
	defer wc.Close()
	call := func(op wire.Op, args, res any) error {
		return wc.Call(ctx, op, m.Tuple().SHA256(), opKey(), time.Now().Add(time.Minute), args, res)
	}
	var w wire.ExecWaitResult
	if err := call(wire.OpExecWait, wire.TerminalArgs{TerminalID: id}, &w); err != nil {
		t.Errorf("exec_wait: %v", err)
		return ""
	}
	var o wire.ExecOutputResult
	if err := call(wire.OpExecOutput, wire.TerminalArgs{TerminalID: id}, &o); err != nil {
		t.Errorf("exec_output: %v", err)
	}
	return o.Output
}

// wireCaller is the part of the receiver's wire client the tests use.
type wireCaller interface {
	Call(ctx context.Context, op wire.Op, tuple, key string, deadline time.Time, args, result any) error
	Close() error
}

// startCommand starts a shell script in m and returns its terminal and
// the client (the caller closes it); nil (and the test failed) when the
// receiver refuses.
func startCommand(ctx context.Context, t *testing.T, m *provision.Machine, script string) (string, wireCaller) {
	t.Helper()
	wc, err := provision.WireClient(ctx, m.Local())
	if err != nil {
		t.Errorf("dial %s: %v", m.Dir(), err)
		return "", nil
	}
	var res wire.ExecStartResult
	if err := wc.Call(ctx, wire.OpExecStart, m.Tuple().SHA256(), opKey(), time.Now().Add(5*time.Minute),
		wire.ExecStartArgs{Argv: []string{"/bin/bash", "-c", script}, Env: map[string]string{"PATH": "/usr/bin:/bin"}},
		&res); err != nil {
		wc.Close()
		t.Errorf("exec_start: %v", err)
		return "", nil
	}
	return res.TerminalID, wc
}

func opKey() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "faults-" + hex.EncodeToString(b)
}
