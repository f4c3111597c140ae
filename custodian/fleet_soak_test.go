package custodian

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/fixtures/etcdtest"
)

// fleetSoakOpsEnv sets the number of ops of TestIntegrationFleetSoak:
// make test runs DefaultFleetSoakOps; the full soak is 1,000
// (TETHER_FLEET_SOAK_OPS=1000, docs/operations.md).
const fleetSoakOpsEnv = "TETHER_FLEET_SOAK_OPS"

// defaultFleetSoakOps keeps the soak in make test to about a minute.
const defaultFleetSoakOps = 250

func fleetSoakOps(t *testing.T) int {
	v := os.Getenv(fleetSoakOpsEnv)
	if v == "" {
		return defaultFleetSoakOps
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 10 {
		t.Fatalf("%s=%q: want a count of at least 10", fleetSoakOpsEnv, v)
	}
	return n
}

// soakOutcome is what one keyed op came to, as the agent saw it.
type soakOutcome int

const (
	soakDone      soakOutcome = iota // answered (run, or from its receipt)
	soakRetry                        // not run, try the same key again (unavailable)
	soakCustodian                    // the custodian is gone or no longer owns the session
)

// classify says what an agent does after err.
func classify(err error) soakOutcome {
	if err == nil {
		return soakDone
	}
	code, ok := acperr.CodeOf(err)
	switch {
	case !ok: // the connection to the custodian broke: it died
		return soakCustodian
	case code == errcode.CodeFenced:
		return soakCustodian
	case code == errcode.CodeUnavailable && strings.Contains(err.Error(), "nothing was sent"):
		return soakDone // a Begin etcd never confirmed, recorded failed "not sent": its replay
	case code == errcode.CodeUnavailable:
		return soakRetry
	}
	return soakDone
}

// soakOp runs op i (a command appending its key to side and printing
// it) to its end, as an agent does: create, wait, output, release, all
// keyed by the op's key. Only the create's answer decides what the agent
// does next; a wait, output or release of a terminal the takeover killed
// may be refused. An op answered in full is recorded in answered; a later
// answer in full of the same op (a retry, at this custodian or a later
// one) must be the same, byte for byte. It returns what the agent does
// next, the op's error, and whether that error is one no op should ever
// get (the test fails).
func soakOp(ctx context.Context, p *fleetProc, i int, answered map[string]string) (soakOutcome, error, bool) {
	key := fmt.Sprintf("op-%04d", i)
	answers, err := p.execAnswers(ctx, key, "echo "+key+" >> side; echo "+key)
	out := classify(err)
	if err == nil {
		got := strings.Join(answers, "\n")
		if prev, ok := answered[key]; ok && prev != got {
			return soakDone, fmt.Errorf("op %s: a retry answered\n%s\nnot the first answers\n%s", key, got, prev), true
		}
		answered[key] = got
	}
	if out != soakDone || err == nil {
		return out, err, false
	}
	code, _ := acperr.CodeOf(err)
	if _, ok := answered[key]; ok {
		return soakDone, fmt.Errorf("op %s was answered in full, its retry got %w", key, err), true
	}
	switch code {
	case errcode.CodeInterrupted, errcode.CodeNotFound, errcode.CodeFateUnknown, errcode.CodeUnavailable:
		return soakDone, err, false // its receipt says what became of it
	}
	return soakDone, fmt.Errorf("op %s: %w", key, err), true
}

// fleetSoak drives the session through successive custodians, killing
// each after a random number of ops at a random moment inside an op.
type fleetSoak struct {
	t         *testing.T
	fc        fleetConfig
	n         int
	kills     int
	takeovers []time.Duration
	restarts  atomic.Int64 // etcd member restarts so far (restartEtcdMembers)
	// answered holds each op answered in full: its answers, one per line.
	answered map[string]string
	// replayed counts the retries of ops answered in full that got the
	// same answers again.
	replayed int
}

// minSoakRestarts: the soak's last op waits until this many etcd member
// restarts happened while ops ran, however fast the machine.
const minSoakRestarts = 2

// awaitRestarts waits (bounded by ctx) until minSoakRestarts restarts
// happened.
func (s *fleetSoak) awaitRestarts(ctx context.Context) {
	for s.restarts.Load() < minSoakRestarts {
		select {
		case <-ctx.Done():
			s.t.Fatalf("only %d etcd member restarts: %v", s.restarts.Load(), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *fleetSoak) run(ctx context.Context) {
	p := startFleet(s.t, s.fc, "soak-0")
	p.bound(s.t)
	var killedAt atomic.Int64 // unix ns of the last kill whose takeover is not measured yet
	budget, retries := s.budget(), 0
	for i := 0; i < s.n; {
		if i == s.n-1 {
			s.awaitRestarts(ctx)
		}
		if budget == 0 {
			go func(p *fleetProc) { // lands anywhere inside the next op
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
				killedAt.Store(time.Now().UnixNano())
				p.kill()
			}(p)
		}
		budget--
		_, before := s.answered[fmt.Sprintf("op-%04d", i)]
		out, err, bad := soakOp(ctx, p, i, s.answered)
		if before && err == nil {
			s.replayed++
		}
		if bad {
			s.t.Fatal(err)
		}
		switch out {
		case soakDone:
			if at := killedAt.Load(); at != 0 && budget >= 0 {
				s.takeovers = append(s.takeovers, time.Since(time.Unix(0, at)))
				killedAt.Store(0)
			}
			i, retries = i+1, 0
		case soakRetry:
			if retries++; retries > 200 {
				s.t.Fatalf("op %d: the op store stayed unavailable: %v", i, err)
			}
			time.Sleep(25 * time.Millisecond)
		case soakCustodian:
			if killedAt.Load() == 0 { // fenced, not killed: this is its end
				killedAt.Store(time.Now().UnixNano())
			}
			p = s.replace(p)
			i, budget = max(0, i-3), s.budget() // the agent retries its last ops on the new custodian
		}
	}
	p.stdin.Close()
	<-p.exited
}

func (s *fleetSoak) budget() int { return 20 + rand.IntN(60) }

// replace ends p (killed already, or fenced: killed now) and starts a
// standby that takes the session over.
func (s *fleetSoak) replace(p *fleetProc) *fleetProc {
	p.kill()
	s.kills++
	fb := s.fc
	fb.Standby = true
	next := startFleet(s.t, fb, fmt.Sprintf("soak-%d", s.kills))
	next.bound(s.t)
	return next
}

// restartEtcdMembers stops and restarts one random member at a time
// (quorum kept) until stop closes, counting the restarts in n.
func restartEtcdMembers(t *testing.T, c *etcdtest.Cluster, stop chan struct{}, n *atomic.Int64) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(700+rand.IntN(1300)) * time.Millisecond):
		}
		i := rand.IntN(c.Members())
		c.Stop(i)
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		if err := c.Restart(i); err != nil {
			t.Errorf("restart member %d: %v", i, err)
			return
		}
		n.Add(1)
	}
}

// TestIntegrationFleetSoak runs keyed commands through a real receiver
// and custodian processes on a real 3-member etcd cluster, each command
// appending a line with its key to a file in the computer. Custodians
// are SIGKILLed at random moments inside an op and replaced by a standby
// that takes the session over; etcd members are stopped and restarted
// one at a time meanwhile. The agent retries its last ops with the same
// keys on each new custodian. At the end every op has exactly one final
// receipt, no line appears twice, an op that ran to its exit has its
// line once, and one failed before dispatch has none.
// TETHER_FLEET_SOAK_OPS sets the number of ops (default 250; 1,000 for
// the full soak).
func TestIntegrationFleetSoak(t *testing.T) {
	n := fleetSoakOps(t)
	rr := startReceiver(t)
	c := etcdtest.Start(t, etcdtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s := &fleetSoak{t: t, fc: newFleetConfig(t, c, rr, rr.tuple, "sess-soak"), n: n, answered: map[string]string{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { restartEtcdMembers(t, c, stop, &s.restarts) })
	stopRestarts := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopRestarts() // also when the soak fails: no restart after the cluster closed
	start := time.Now()
	s.run(ctx)
	stopRestarts()
	restarts := s.restarts.Load()
	t.Logf("%d ops in %s, %d custodian kills, %d etcd member restarts; takeover to the first answered op: %s; %d retries of ops answered in full got the same answers",
		n, time.Since(start).Round(time.Millisecond), s.kills, restarts, durationSummary(s.takeovers), s.replayed)
	if s.kills < 2 || restarts < minSoakRestarts {
		t.Errorf("too few faults to mean anything: %d kills, %d restarts", s.kills, restarts)
	}
	if s.replayed == 0 {
		t.Error("no op answered in full was retried after a takeover: the replay was not exercised")
	}
	checkFleetSoak(t, c, s.fc, rr, n)
}

// checkFleetSoak claims the session once more (interrupting what the last
// custodian left in flight) and checks each op's create receipt against
// the side-effect file.
func checkFleetSoak(t *testing.T, c *etcdtest.Cluster, fc fleetConfig, rr *realReceiver, n int) {
	t.Helper()
	s, err := opstore.OpenEtcd(context.Background(), opstore.EtcdOptions{Client: c.Client(t), Prefix: fc.Prefix, Name: "checker"})
	must(t, err)
	defer s.Close()
	if _, err := s.WaitClaim(context.Background(), fc.Session); err != nil {
		t.Fatal(err)
	}
	lines := map[string]int{}
	for _, l := range sideLines(t, rr, "side") {
		lines[l]++
	}
	outcomes := map[opstore.Outcome]int{}
	for i := range n {
		key := fmt.Sprintf("op-%04d", i)
		raw, err := s.Get(opstore.Key(fc.Tuple.SHA256(), fc.Session, key+":create"))
		if err != nil {
			t.Errorf("%s has no receipt: %v", key, err)
			continue
		}
		r, err := opstore.Unmarshal(raw)
		must(t, err)
		outcomes[r.Outcome]++
		got := lines[key]
		switch {
		case got > 1:
			t.Errorf("%s ran %d times", key, got)
		case !r.Outcome.Final():
			t.Errorf("%s is %s, not final", key, r.Outcome)
		case (r.Outcome == opstore.NeedsReview || r.Outcome == opstore.Verified) && got != 1:
			t.Errorf("%s is %s but ran %d times", key, r.Outcome, got)
		case r.Outcome == opstore.Failed && got != 0:
			t.Errorf("%s failed (%s) but ran %d times", key, r.Note, got)
		}
		delete(lines, key)
	}
	if len(lines) != 0 {
		t.Errorf("side effects without an op: %v", lines)
	}
	t.Logf("outcomes: %v", outcomes)
}

// durationSummary prints the p50 and p95 of ds.
func durationSummary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("p50 %s, p95 %s (n=%d)", s[len(s)/2].Round(time.Millisecond), s[(len(s)*95)/100].Round(time.Millisecond), len(s))
}
