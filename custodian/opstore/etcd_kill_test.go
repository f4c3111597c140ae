package opstore

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tetherdev/tether/admission/backoff"
	"github.com/tetherdev/tether/fixtures/etcdtest"
)

// etcdHelperEnv selects the role of a re-exec'd test binary that owns a
// session in etcd: "owner" (TestIntegrationEtcdOwnerKilled) or "soak"
// (TestIntegrationEtcdSoak).
const etcdHelperEnv = "OPSTORE_ETCD_HELPER"

// ownerTTL is the ownership lease of the helpers: a killed owner's
// sessions may be claimed this long after its last renewal.
const ownerTTL = 2 * time.Second

// etcdHelper is the child process: it owns sess-1 until it is killed.
func etcdHelper(mode string) {
	fail := func(err error) { fmt.Fprintln(os.Stderr, err); os.Exit(3) }
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv("OPSTORE_ETCD_ENDPOINTS"), ","),
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	s, err := OpenEtcd(ctx, EtcdOptions{Client: cli, Prefix: os.Getenv("OPSTORE_ETCD_PREFIX"),
		Name: fmt.Sprintf("helper-%d", os.Getpid()), LeaseTTL: ownerTTL, RequestTimeout: 2 * time.Second})
	if err != nil {
		fail(err)
	}
	c, err := s.WaitClaim(ctx, "sess-1")
	if err != nil {
		fail(err)
	}
	fmt.Printf("claimed %d %d\n", c.Token, len(c.Interrupted))
	switch mode {
	case "owner":
		err = ownerSteps(ctx, s)
	case "soak":
		err = soakSteps(ctx, s)
	}
	if err != nil {
		fail(err)
	}
	fmt.Println("all")
	s.Close()
	os.Exit(0)
}

// ownerSteps finishes one key, leaves another in flight, says ready and
// waits to be killed.
func ownerSteps(ctx context.Context, s *EtcdStore) error {
	tk, _, err := s.Begin(ctx, intent("done", "r"))
	if err != nil {
		return err
	}
	if err := tk.Finish(&Receipt{Outcome: Verified, Response: json.RawMessage(`{"ok":true}`)}); err != nil {
		return err
	}
	if _, _, err := s.Begin(ctx, intent("inflight", "r")); err != nil {
		return err
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
	return errors.New("not killed")
}

// soakSteps runs keyed ops START..N-1. Each op's side effect is one line
// with its key appended to FILE, made between Begin and Finish as a real
// dispatch is, and the "command" runs on for up to 10 ms before its
// result is recorded. A key answered from its receipt (done or interrupted
// before) runs nothing; a key still in flight under an earlier owner's
// Begin whose answer was lost is left for the next takeover. When the
// helper's own lease lapses (its keepalive failed through member
// restarts), Begin refuses and the helper claims the session again, as a
// custodian does: that takeover interrupts what it had in flight.
func soakSteps(ctx context.Context, s *EtcdStore) error {
	start, _ := strconv.Atoi(os.Getenv("OPSTORE_SOAK_START"))
	n, _ := strconv.Atoi(os.Getenv("OPSTORE_SOAK_N"))
	f, err := os.OpenFile(os.Getenv("OPSTORE_SOAK_FILE"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	for i := start; i < n; i++ {
		if err := soakOne(ctx, s, f, i); err != nil {
			return err
		}
		fmt.Printf("done %d\n", i)
	}
	return nil
}

// soakPatience bounds how long a helper retries one op while etcd does
// not answer, and how long it waits to claim the session again.
const soakPatience = 30 * time.Second

func soakOne(ctx context.Context, s *EtcdStore, f *os.File, i int) error {
	key := fmt.Sprintf("op-%04d", i)
	deadline := time.Now().Add(soakPatience)
	for {
		tk, _, err := s.Begin(ctx, intent(key, "append"))
		switch {
		case tk != nil:
			if _, err := f.WriteString(key + "\n"); err != nil {
				return err
			}
			time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond) // the command runs on
			_ = tk.Finish(&Receipt{Outcome: Verified, Response: json.RawMessage(`{"line":"` + key + `"}`)})
			return nil // a lost Finish leaves the key to the next takeover: interrupted
		case err == nil: // answered from its receipt: nothing runs
			return nil
		case errors.Is(err, ErrConflict):
			return nil // in flight under a Begin whose answer was lost
		case errors.Is(err, ErrFenced), errors.Is(err, ErrNotClaimed):
			if err := soakReclaim(ctx, s); err != nil { // the retry then sees what landed
				return err
			}
		case errors.Is(err, ErrUnavailable) && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond) // a member restarting: the retry sees what landed
		default:
			return err
		}
	}
}

// soakReclaim claims sess-1 again after the helper's own lease lapsed and
// says so ("reclaimed TOKEN INTERRUPTED").
func soakReclaim(ctx context.Context, s *EtcdStore) error {
	ctx, cancel := context.WithTimeout(ctx, soakPatience)
	defer cancel()
	c, err := s.WaitClaim(ctx, "sess-1")
	if err != nil {
		return fmt.Errorf("claim sess-1 again after the lease lapsed: %w", err)
	}
	fmt.Printf("reclaimed %d %d\n", c.Token, len(c.Interrupted))
	return nil
}

// helperProc is a running helper and its stdout lines.
type helperProc struct {
	cmd   *exec.Cmd
	lines chan string
	exit  chan error
}

func startHelper(t *testing.T, c *etcdtest.Cluster, mode, prefix string, env ...string) *helperProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), etcdHelperEnv+"="+mode, "OPSTORE_ETCD_PREFIX="+prefix,
		"OPSTORE_ETCD_ENDPOINTS="+strings.Join(c.Endpoints(), ","))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helperProc{cmd: cmd, lines: make(chan string, 4096), exit: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
		h.exit <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	return h
}

// next returns the helper's next line, or fails the test.
func (h *helperProc) next(t *testing.T, within time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			t.Fatalf("helper exited: %v", <-h.exit)
		}
		return l
	case <-time.After(within):
		t.Fatalf("helper said nothing within %s", within)
	}
	return ""
}

func (h *helperProc) kill() {
	h.cmd.Process.Signal(syscall.SIGKILL)
	for range h.lines {
	}
	<-h.exit
}

// TestIntegrationEtcdOwnerKilled SIGKILLs a process that owns a session
// with one key finished and one in flight. A standby claims the session
// within the lease TTL (plus the time a claim takes), the in-flight key
// is interrupted (a retry gets that receipt and runs nothing), and the
// finished key's receipt is replayed byte for byte.
func TestIntegrationEtcdOwnerKilled(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	prefix := freshPrefix(t)
	h := startHelper(t, c, "owner", prefix)
	if l := h.next(t, 30*time.Second); !strings.HasPrefix(l, "claimed ") {
		t.Fatalf("helper: %q", l)
	}
	if l := h.next(t, 30*time.Second); l != "ready" {
		t.Fatalf("helper: %q", l)
	}
	standby := openEtcd(t, cli, prefix, "standby", Options{})
	done, err := standby.Get(testKey("done"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := standby.Claim(context.Background(), "sess-1"); !errors.Is(err, ErrOwned) {
		t.Fatalf("standby claimed a live owner's session: %v", err)
	}
	killed := time.Now()
	h.kill()
	cl := claimT(t, standby, "sess-1")
	took := time.Since(killed)
	t.Logf("takeover %s after SIGKILL (lease TTL %s)", took, ownerTTL)
	if took > ownerTTL+3*time.Second {
		t.Errorf("takeover took %s, lease TTL %s", took, ownerTTL)
	}
	if !slices.Equal(cl.Interrupted, []string{"inflight"}) {
		t.Fatalf("interrupted by the takeover: %v, want [inflight]", cl.Interrupted)
	}
	tk, r, err := standby.Begin(context.Background(), intent("inflight", "r"))
	if tk != nil || err != nil || r == nil || r.Outcome != Interrupted {
		t.Fatalf("retry of the in-flight key = %v, %+v, %v; want its interrupted receipt", tk, r, err)
	}
	_, r, err = standby.Begin(context.Background(), intent("done", "r"))
	again, _ := r.Marshal()
	if err != nil || string(again) != string(done) {
		t.Fatalf("retry of the finished key = %s, %v; want %s", again, err, done)
	}
}

// TestIntegrationEtcdSoak runs 1,000 keyed ops, each appending a line
// with its key to a file, through owner processes that are SIGKILLed at
// random moments while etcd members are stopped and restarted one at a
// time (quorum kept). Each new owner claims the session (waiting out the
// killed owner's lease) and retries from a few ops before where the last
// one got, as an agent retries. Every second owner also has its own
// lease ended behind its back halfway (revoked, as an expiry through a
// partition looks to it; member restarts can cause real ones): it must
// claim the session again and go on. At the end every key has exactly one
// final receipt, no key's line appears twice, a verified key's line
// appears exactly once and a key that failed before dispatch has none.
func TestIntegrationEtcdSoak(t *testing.T) {
	const n = 1000
	c := etcdtest.Start(t, etcdtest.Options{})
	prefix := freshPrefix(t)
	file := filepath.Join(t.TempDir(), "side-effects")
	stop := make(chan struct{})
	var restarts int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		restarts = restartMembers(t, c, stop)
	}()
	// Registered after the cluster's cleanup, so it runs first: a failing
	// test stops the restarts before the cluster closes.
	stopRestarts := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopRestarts)
	soak := runSoakOwners(t, c, prefix, file, n)
	stopRestarts()
	t.Logf("%d ops, %d owner kills, %d member restarts, %d owner leases ended, %d re-claims; takeover after SIGKILL: %s",
		n, soak.kills, restarts, soak.lapses, soak.reclaims, summary(soak.takeovers))
	if soak.kills < 3 || restarts < 3 || soak.lapses < 2 {
		t.Errorf("too few faults to mean anything: %d kills, %d restarts, %d leases ended", soak.kills, restarts, soak.lapses)
	}
	checkSoak(t, c, prefix, file, n)
}

// soakRun is what runSoakOwners did: owner kills, owner leases ended
// behind the owner's back, re-claims by owners whose own lease ended, and
// the time from each kill to the next owner's claim.
type soakRun struct {
	kills, lapses, reclaims int
	takeovers               []time.Duration
}

// runSoakOwners starts owners until one reaches the end, killing each
// after a random number of ops.
func runSoakOwners(t *testing.T, c *etcdtest.Cluster, prefix, file string, n int) soakRun {
	var run soakRun
	next := 0
	var killedAt time.Time
	cli := c.Client(t)
	for owner := 0; ; owner++ {
		h := startHelper(t, c, "soak", prefix, "OPSTORE_SOAK_FILE="+file,
			fmt.Sprintf("OPSTORE_SOAK_START=%d", max(0, next-3)), fmt.Sprintf("OPSTORE_SOAK_N=%d", n))
		if l := h.next(t, 60*time.Second); !strings.HasPrefix(l, "claimed ") {
			t.Fatalf("owner: %q", l)
		}
		if !killedAt.IsZero() {
			run.takeovers = append(run.takeovers, time.Since(killedAt))
		}
		var lapse func()
		if owner%2 == 1 {
			lapse = func() { revokeOwnerLease(t, cli, prefix, "sess-1") }
		}
		if soakOwner(t, h, &run, &next, n, lapse) {
			return run
		}
		time.Sleep(time.Duration(rand.IntN(15)) * time.Millisecond) // land anywhere inside an op
		killedAt = time.Now()
		h.kill()
		run.kills++
	}
}

// soakOwner reads an owner's lines until its random budget of ops is
// spent (false: kill it) or it reached the end (true). next is the op
// after the last one it did. lapse, if set, ends the owner's lease
// halfway (while at least 50 ops remain, so it Begins again); the owner
// is then not killed before it said it claimed the session again.
func soakOwner(t *testing.T, h *helperProc, run *soakRun, next *int, n int, lapse func()) bool {
	budget := 60 + rand.IntN(140)
	half, awaitReclaim := budget/2, false
	for budget > 0 || awaitReclaim {
		l := h.next(t, 60*time.Second)
		switch {
		case l == "all":
			if awaitReclaim {
				t.Fatalf("owner finished without claiming the session again after its lease ended")
			}
			<-h.exit
			return true
		case strings.HasPrefix(l, "reclaimed "):
			run.reclaims++
			awaitReclaim = false
		case strings.HasPrefix(l, "done "):
			i, err := strconv.Atoi(strings.TrimPrefix(l, "done "))
			if err != nil {
				t.Fatalf("owner: %q", l)
			}
			*next = i + 1
			if budget--; budget == half && lapse != nil && *next < n-50 {
				lapse()
				run.lapses++
				awaitReclaim = true
			}
		default:
			t.Fatalf("owner: %q", l)
		}
	}
	return false
}

// revokeOwnerLease ends the lease of sid's owner behind its back.
func revokeOwnerLease(t *testing.T, cli *clientv3.Client, prefix, sid string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := (&EtcdStore{opts: EtcdOptions{Prefix: prefix}}).ownerKey(sid)
	for {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatalf("read the owner of %s: %v", sid, err)
		}
		if len(resp.Kvs) == 1 {
			if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return // ended, or had ended by itself
			}
		}
		if err := backoff.Sleep(ctx, 50*time.Millisecond); err != nil { // a member restarting, or the owner re-claiming
			t.Fatalf("end the lease of %s's owner: %v", sid, err)
		}
	}
}

// restartMembers stops and restarts one random member at a time until
// stop closes; it returns how many restarts it made.
func restartMembers(t *testing.T, c *etcdtest.Cluster, stop chan struct{}) int {
	n := 0
	for {
		select {
		case <-stop:
			return n
		case <-time.After(time.Duration(500+rand.IntN(1000)) * time.Millisecond):
		}
		i := rand.IntN(c.Members())
		c.Stop(i)
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		if err := c.Restart(i); err != nil {
			t.Errorf("restart member %d: %v", i, err)
			return n
		}
		n++
	}
}

// checkSoak claims the session once more (interrupting what the last
// owners left in flight) and checks every key's receipt against the
// side-effect file.
func checkSoak(t *testing.T, c *etcdtest.Cluster, prefix, file string, n int) {
	cli := c.Client(t)
	final := openEtcd(t, cli, prefix, "checker", Options{})
	claimT(t, final, "sess-1")
	lines := countLines(t, file)
	rs, err := final.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != n {
		t.Fatalf("%d receipts, want %d", len(rs), n)
	}
	outcomes := map[Outcome]int{}
	for _, r := range rs {
		outcomes[r.Outcome]++
		got := lines[r.OpKey]
		switch {
		case got > 1:
			t.Errorf("%s ran %d times", r.OpKey, got)
		case r.Outcome == Verified && got != 1:
			t.Errorf("%s verified but ran %d times", r.OpKey, got)
		case r.Outcome == Failed && got != 0:
			t.Errorf("%s failed before dispatch but ran %d times", r.OpKey, got)
		case !r.Outcome.Final():
			t.Errorf("%s is %s, not final", r.OpKey, r.Outcome)
		}
		delete(lines, r.OpKey)
	}
	if len(lines) != 0 {
		t.Errorf("side effects without a receipt: %v", lines)
	}
	t.Logf("outcomes: %v", outcomes)
}

func countLines(t *testing.T, path string) map[string]int {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out[sc.Text()]++
	}
	return out
}

// summary prints the p50 and p95 of ds.
func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("p50 %s, p95 %s (n=%d)", s[len(s)/2].Round(time.Millisecond), s[(len(s)*95)/100].Round(time.Millisecond), len(s))
}
