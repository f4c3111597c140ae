package faults

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// CyclesEnv sets the churn test's number of create/delete cycles
// (`make faults` sets 1000; default defaultCycles).
const (
	CyclesEnv     = "TETHER_FAULTS_CYCLES"
	defaultCycles = 60
	churnCapacity = 3 // --max-computers, the warm pool's machine included
	churnClients  = 4
)

// TestIntegrationChurn runs create/delete cycles from several clients
// at once against a daemon with room for churnCapacity computers (one of
// them the warm pool's): a quarter of the creates are abandoned by their
// client at a random moment, and the daemon is SIGKILLed and restarted
// every few dozen cycles. All the while a sampler counts, from the
// cgroup hierarchies, the computers of this daemon that exist at once;
// never more than the capacity. At the end no computer id (nor sandbox)
// was handed out twice, nothing is left on the host, and the transition
// log verifies.
func TestIntegrationChurn(t *testing.T) {
	n := cycles(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(n)*time.Second+5*time.Minute)
	defer cancel()
	e := newEnv(ctx, t)
	args := []string{"--max-computers", strconv.Itoa(churnCapacity), "--pool", "1", "--owner-quota", "1000"}
	e.start(ctx, t, "", args...)
	start := time.Now()
	smp := startSampler(e)
	ch := &churn{e: e, n: int64(n), ids: map[string]bool{}, sandboxes: map[string]bool{}}
	var wg sync.WaitGroup
	for range churnClients {
		wg.Go(func() { ch.client(ctx, t) })
	}
	kills := ch.killEvery(ctx, t, max(int64(n)/20, 10), args)
	wg.Wait()
	peak, samples := smp.stop()
	t.Logf("%d cycles in %s: %d creates answered, %d abandoned by their client, %d refused, %d daemon kills; "+
		"peak %d computers in cgroups over %d samples (capacity %d)", n, time.Since(start).Round(time.Millisecond),
		len(ch.ids), ch.abandoned.Load(), ch.refused.Load(), kills, peak, samples, churnCapacity)
	if peak > churnCapacity {
		t.Errorf("%d computers had cgroups at once; the capacity is %d", peak, churnCapacity)
	}
	if peak == 0 || samples < 10 {
		t.Errorf("the sampler saw %d computers over %d samples: it measured nothing", peak, samples)
	}
	live := checkRecordsTrue(ctx, t, e)
	t.Logf("%d computers still made at the end: their create's answer never reached its client "+
		"(abandoned, or the daemon killed, after the create); their lease bounds them", len(live))
	endAll(ctx, t, e)
	verifyLog(ctx, t, e)
}

func cycles(t *testing.T) int {
	v := os.Getenv(CyclesEnv)
	if v == "" {
		return defaultCycles
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q is not a positive number", CyclesEnv, v)
	}
	return n
}

// churn is the shared count of one churn run.
type churn struct {
	e                  *env
	n                  int64
	done               atomic.Int64 // cycles that reached a running daemon
	abandoned, refused atomic.Int64
	down               sync.RWMutex // held (write) while the daemon restarts

	mu        sync.Mutex
	ids       map[string]bool
	sandboxes map[string]bool
}

// client runs cycles until n are done: create (abandoned at a random
// moment one time in four), then delete what was made.
func (ch *churn) client(ctx context.Context, t *testing.T) {
	for ch.done.Load() < ch.n && ctx.Err() == nil {
		ch.down.RLock()
		ch.down.RUnlock()
		cctx, cancel := context.WithCancel(ctx)
		abandon := rand.IntN(4) == 0
		if abandon {
			time.AfterFunc(time.Duration(rand.IntN(400))*time.Millisecond, cancel)
		}
		c, err := ch.e.cl.Create(cctx, api.CreateRequest{LeaseTTLSeconds: 30})
		cancel()
		var apiErr *api.Error
		switch {
		case err == nil:
			ch.handedOut(t, c)
			ch.deleteUntilDone(ctx, t, c.ID)
		case abandon && errors.Is(err, context.Canceled):
			ch.abandoned.Add(1)
		case errors.As(err, &apiErr):
			ch.refused.Add(1)
		default:
			continue // the daemon was killed: not a cycle
		}
		ch.done.Add(1)
	}
}

// handedOut records a computer a create returned; twice is an error.
func (ch *churn) handedOut(t *testing.T, c api.Computer) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.ids[c.ID] {
		t.Errorf("computer id %s handed out twice", c.ID)
	}
	ch.ids[c.ID] = true
	if c.Tuple == nil {
		t.Errorf("computer %s handed out without a tuple", c.ID)
		return
	}
	if ch.sandboxes[c.Tuple.Sandbox] {
		t.Errorf("sandbox %s (computer %s) handed out twice", c.Tuple.Sandbox, c.ID)
	}
	ch.sandboxes[c.Tuple.Sandbox] = true
}

// deleteUntilDone deletes id, again while the daemon is down.
func (ch *churn) deleteUntilDone(ctx context.Context, t *testing.T, id string) {
	var err error
	for ctx.Err() == nil {
		ch.down.RLock()
		err = ch.e.cl.Delete(ctx, id)
		ch.down.RUnlock()
		var apiErr *api.Error
		if err == nil || errors.As(err, &apiErr) {
			break
		}
	}
	if err != nil {
		t.Errorf("delete %s: %v", id, err)
	}
}

// killEvery SIGKILLs and restarts the daemon each time every cycles more
// cycles are done, until all are; it returns the number of kills.
func (ch *churn) killEvery(ctx context.Context, t *testing.T, every int64, args []string) int {
	kills := 0
	for next := every; ; next += every {
		for ch.done.Load() < next {
			if ch.done.Load() >= ch.n || ctx.Err() != nil {
				return kills
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Duration(rand.IntN(200)) * time.Millisecond) // somewhere in the next cycles
		ch.e.d.kill()
		kills++
		ch.down.Lock()
		ch.e.start(ctx, t, "", args...)
		ch.down.Unlock()
	}
}

// sampler counts, every few milliseconds, this daemon's computers that
// have a cgroup (named for a sandbox seen in its state directory).
type sampler struct {
	e       *env
	quit    chan struct{}
	done    chan struct{}
	peak    int
	samples int
}

func startSampler(e *env) *sampler {
	s := &sampler{e: e, quit: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s
}

func (s *sampler) run() {
	defer close(s.done)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		// The cgroups first: a computer's state file names its sandbox
		// before its cgroups exist, so the scan after finds every one.
		cgs, err := cgroupsNamed(nil)
		if err != nil {
			continue
		}
		s.e.seen.scan()
		n := 0
		for sb := range cgs {
			if _, ok := s.e.seen.bySandbox(sb); ok {
				n++
			}
		}
		s.peak, s.samples = max(s.peak, n), s.samples+1
	}
}

// stop ends the sampler and returns the peak and the number of samples.
func (s *sampler) stop() (int, int) {
	close(s.quit)
	<-s.done
	return s.peak, s.samples
}
