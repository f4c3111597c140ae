package receiver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/internal/socktest"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// TestAttackTerminalsCappedPerTuple: a session that starts commands and
// never releases their terminals fills its own quota only; another
// tuple (the next session) still starts commands.
func TestAttackTerminalsCappedPerTuple(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{Limits: Limits{MaxTerminals: 8, MaxTerminalsPerTuple: 4}})
	next := f.newGrant("next", allOps...)
	f.publish(f.grant, next)
	started := 0
	for range 9 {
		res, err := f.call(f.grant, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}})
		if err != nil {
			if code(err) != errcode.CodeDenied {
				t.Fatalf("hoarding tuple's start %d: %v, want denied", started+1, err)
			}
			break
		}
		f.wait(f.grant, res.(*wire.ExecStartResult).TerminalID) // finished, never released
		started++
	}
	if started != 4 {
		t.Fatalf("one tuple kept %d unreleased terminals, want its limit 4", started)
	}
	if _, err := f.call(next, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}}); err != nil {
		t.Fatalf("the next session's start while another hoards terminals: %v", err)
	}
}

// conns serves the fixture's handler through a real wireserver.Server, one
// socketpair per connection, as the daemon does.
type conns struct {
	f   *fixture
	srv *wireserver.Server
}

func newConns(f *fixture) *conns {
	srv, err := wireserver.NewServer(f.h, wireserver.ServerConfig{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { srv.Close() })
	return &conns{f: f, srv: srv}
}

// open returns a client on a new connection; closing it ends the
// connection as a crashed custodian's would.
func (c *conns) open() *wireclient.Client {
	cc, sc := socktest.Pair(c.f.t)
	go c.srv.ServeConn(context.Background(), sc)
	cl, err := wireclient.NewClient(cc, wireclient.ClientConfig{})
	if err != nil {
		c.f.t.Fatal(err)
	}
	c.f.t.Cleanup(func() { cl.Close() })
	return cl
}

func (c *conns) call(cl *wireclient.Client, op wire.Op, args, result any) error {
	n := c.f.seq.Add(1)
	return cl.Call(context.Background(), op, c.f.grant.Tuple.SHA256(), fmt.Sprintf("c-%d", n),
		time.Now().Add(30*time.Second), args, result)
}

// alive reports whether pid is a live process of the grant's uid.
func alive(t *testing.T, pid int) bool {
	for _, p := range procsOfUID(t, gUID) {
		if p == pid {
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			return err == nil && !isZombie(st)
		}
	}
	return false
}

func isZombie(stat []byte) bool {
	for i := len(stat) - 1; i > 0; i-- { // state follows the last ')'
		if stat[i] == ')' {
			return i+2 < len(stat) && stat[i+2] == 'Z'
		}
	}
	return false
}

func waitDead(t *testing.T, pid int, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for alive(t, pid) {
		if time.Now().After(deadline) {
			t.Fatalf("command %d still runs %s after its connection ended", pid, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAttackOrphanedCommandKilledAfterGrace: a command whose connection
// ends (a custodian that crashed) and that no connection asks for within
// the orphan grace is killed and forgotten, not left running until its
// deadline (ten minutes here).
func TestAttackOrphanedCommandKilledAfterGrace(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{Limits: Limits{OrphanGraceS: 1}})
	cs := newConns(f)
	crashed := cs.open()
	var st wire.ExecStartResult
	if err := cs.call(crashed, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/sleep", "600"}}, &st); err != nil {
		t.Fatal(err)
	}
	crashed.Close()
	waitDead(t, st.PID, 15*time.Second) // before: alive until its 600 s deadline
	later := cs.open()
	err := cs.call(later, wire.OpExecOutput, wire.TerminalArgs{TerminalID: st.TerminalID}, &wire.ExecOutputResult{})
	if code(asWire(err)) != errcode.CodeNotFound {
		t.Fatalf("orphaned terminal after its grace: %v, want not_found (forgotten)", err)
	}
}

// TestReattachWithinGraceKeepsCommand: a new connection that asks for the
// terminal within the grace takes it over; the command survives the
// grace and is orphaned again only when that connection ends.
func TestReattachWithinGraceKeepsCommand(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{Limits: Limits{OrphanGraceS: 1}})
	cs := newConns(f)
	first := cs.open()
	var st wire.ExecStartResult
	if err := cs.call(first, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/sleep", "600"}}, &st); err != nil {
		t.Fatal(err)
	}
	first.Close()
	second := cs.open()
	var out wire.ExecOutputResult
	if err := cs.call(second, wire.OpExecOutput, wire.TerminalArgs{TerminalID: st.TerminalID}, &out); err != nil || out.Exit != nil {
		t.Fatalf("reattach within the grace: %v %+v", err, out)
	}
	time.Sleep(3 * time.Second) // three graces: an orphan would be dead by now
	if err := cs.call(second, wire.OpExecOutput, wire.TerminalArgs{TerminalID: st.TerminalID}, &out); err != nil || out.Exit != nil || !alive(t, st.PID) {
		t.Fatalf("reattached command after the grace: %v %+v alive=%v", err, out, alive(t, st.PID))
	}
	second.Close()
	waitDead(t, st.PID, 15*time.Second)
}

func asWire(err error) error {
	var we *errcode.Error
	if errors.As(err, &we) {
		return we
	}
	return err
}

func TestLimitsPerTupleAndGraceDefaults(t *testing.T) {
	l, err := Limits{}.withDefaults()
	if err != nil || l.MaxTerminalsPerTuple != 64 || l.OrphanGraceS != 30 {
		t.Fatalf("defaults: %+v %v", l, err)
	}
	if l, err = (Limits{MaxTerminals: 16, MaxRuntimeS: 10}).withDefaults(); err != nil || l.MaxTerminalsPerTuple != 16 || l.OrphanGraceS != 10 {
		t.Fatalf("defaults bounded by max_terminals and max_runtime_s: %+v %v", l, err)
	}
	for _, bad := range []Limits{{MaxTerminals: 4, MaxTerminalsPerTuple: 5}, {MaxTerminalsPerTuple: -1},
		{OrphanGraceS: -1}, {MaxRuntimeS: 10, OrphanGraceS: 11}} {
		if _, err := bad.withDefaults(); !errors.Is(err, ErrLimits) {
			t.Errorf("%+v: %v, want ErrLimits", bad, err)
		}
	}
}

// TestAttackLeasedFileAnswersBusy: a process in the computer holds a
// write lease on a file (fcntl F_SETLEASE); an edit and a read of it are
// answered busy, naming the lease, not path_escape, and nothing changes.
func TestAttackLeasedFileAnswersBusy(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	path := filepath.Join(f.grant.Tuple.Root, "leased.txt")
	if err := os.WriteFile(path, []byte("held\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lf, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if _, err := unix.FcntlInt(lf.Fd(), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("held\n"))
	_, err = f.call(f.grant, wire.OpWrite, wire.WriteArgs{Path: "leased.txt", Content: "new\n", ExpectSHA256: hex.EncodeToString(sum[:])})
	if code(err) != errcode.CodeBusy {
		t.Fatalf("edit of a leased file: %v, want busy", err)
	}
	if _, err := f.call(f.grant, wire.OpRead, wire.ReadArgs{Path: "leased.txt"}); code(err) != errcode.CodeBusy {
		t.Fatalf("read of a leased file: %v, want busy", err)
	}
	unix.FcntlInt(lf.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
	if got, _ := os.ReadFile(path); string(got) != "held\n" {
		t.Fatalf("leased file changed to %q", got)
	}
}
