package custodian

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/fixtures/etcdtest"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// sideLines returns the lines of the side-effect file rel in rr's root.
func sideLines(t testing.TB, rr *realReceiver, rel string) []string {
	t.Helper()
	data, err := os.ReadFile(rr.file(rel))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	must(t, err)
	return strings.Fields(string(data))
}

// directCall sends one request straight to the receiver with token tok.
func directCall(t testing.TB, rr *realReceiver, tok uint64, op wire.Op, args any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := StreamDialer(transport.Unix{Path: rr.sock, HostOnly: true}.Dial, wireclient.ClientConfig{})(ctx)
	must(t, err)
	defer conn.Close()
	dl, _ := ctx.Deadline()
	return conn.CallFenced(ctx, op, rr.tuple.SHA256(), newKey("direct"), tok, dl, args, nil)
}

// TestIntegrationFleetPartitionFenced freezes the owning custodian (A,
// SIGSTOP) right after the intent of a command is recorded in etcd and
// before it is sent. A standby (B) takes the session over once A's lease
// expires, re-attaches and runs a command; the retry of A's command at B
// gets its interrupted receipt. Then A resumes and sends its command: the
// receiver refuses it as fenced (A's token is below B's), and nothing of
// A runs: the side-effect file has B's line and A's first, never A's
// late one. A's later requests are refused too, and the receiver keeps
// refusing A's token after a restart while B's still works.
func TestIntegrationFleetPartitionFenced(t *testing.T) {
	rr := startReceiver(t)
	c := etcdtest.Start(t, etcdtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fc := newFleetConfig(t, c, rr, rr.tuple, "sess-partition")
	fa := fc
	fa.StopIn, fa.StopAt, fa.StopNth = acp.ClientMethodTerminalCreate, "after-intent", 2
	a := startFleet(t, fa, "custodian-a")
	tokA := a.bound(t)
	if code, err := a.exec(ctx, "p1", "echo p1 >> side"); err != nil || code != 0 {
		t.Fatalf("A's first command: %d %v", code, err)
	}
	late := make(chan error, 1)
	go func() { _, err := a.create(ctx, "p2", "echo a-late >> side"); late <- err }()
	waitState(t, a.cmd.Process.Pid, "T") // frozen after p2's intent landed in etcd

	fb := fc
	fb.Standby = true
	b := startFleet(t, fb, "custodian-b")
	b.waiting(t)
	if l := b.next(t, time.Minute); !strings.HasPrefix(l, "claimed ") || !strings.HasSuffix(l, " 1") {
		t.Fatalf("B's takeover: %q, want one key interrupted (p2)", l)
	}
	tokB := b.bound(t)
	if tokB <= tokA {
		t.Fatalf("B's token %d is not above A's %d", tokB, tokA)
	}
	if code, err := b.exec(ctx, "b1", "echo b1 >> side"); err != nil || code != 0 {
		t.Fatalf("B's command: %d %v", code, err)
	}
	_, err := b.create(ctx, "p2", "echo a-late >> side")
	wantCode(t, err, errcode.CodeInterrupted)
	_, err = b.create(ctx, "p2", "echo other >> side")
	wantCode(t, err, errcode.CodeOpKeyConflict)

	must(t, a.cmd.Process.Signal(syscall.SIGCONT))
	err = <-late
	wantCode(t, err, errcode.CodeFenced)
	if !strings.Contains(err.Error(), "highest this receiver has seen") {
		t.Fatalf("A's late command was not refused by the receiver: %v", err)
	}
	_, err = a.agent.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: "sess-partition",
		Path: filepath.Join(rr.tuple.Root, "a-write"), Content: "x", Meta: a.meta("a-write")})
	wantCode(t, err, errcode.CodeFenced)
	_, err = a.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: "sess-partition",
		Path: filepath.Join(rr.tuple.Root, "side"), Meta: a.meta("a-read")})
	wantCode(t, err, errcode.CodeFenced)
	if got := sideLines(t, rr, "side"); strings.Join(got, ",") != "p1,b1" {
		t.Fatalf("side effects %v, want [p1 b1]: something of the frozen owner ran", got)
	}
	if _, err := os.Lstat(rr.file("a-write")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the frozen owner's write ran")
	}

	rr.Restart(t)
	if err := directCall(t, rr, tokA, wire.OpWrite, wire.WriteArgs{Path: "after-restart", Content: "x"}); !isCode(err, errcode.CodeFenced) {
		t.Fatalf("A's token after a receiver restart: %v, want fenced", err)
	}
	if err := directCall(t, rr, tokB, wire.OpAttach, wire.AttachArgs{}); err != nil {
		t.Fatalf("B's token after a receiver restart: %v", err)
	}
	if _, err := os.Lstat(rr.file("after-restart")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a fenced write ran after the restart")
	}
	checkReceipt(t, c, fc, "p2:create", opstore.Interrupted)
}

// isCode reports whether err carries the wire code.
func isCode(err error, code errcode.Code) bool {
	var we *errcode.Error
	return errors.As(err, &we) && we.Code == code
}

// checkReceipt reads key's receipt in the fleet store (a fresh client)
// and checks its outcome.
func checkReceipt(t testing.TB, c *etcdtest.Cluster, fc fleetConfig, key string, want opstore.Outcome) {
	t.Helper()
	s, err := opstore.OpenEtcd(context.Background(), opstore.EtcdOptions{Client: c.Client(t), Prefix: fc.Prefix, Name: "checker"})
	must(t, err)
	defer s.Close()
	raw, err := s.Get(opstore.Key(fc.Tuple.SHA256(), fc.Session, key))
	must(t, err)
	r, err := opstore.Unmarshal(raw)
	must(t, err)
	if r.Outcome != want {
		t.Fatalf("receipt of %s is %s, want %s", key, r.Outcome, want)
	}
}
