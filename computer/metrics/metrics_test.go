package metrics

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherdev/tether/computer/api"
)

// TestComputersByState: every state is exported at zero from the start;
// SetComputers sets them all, Transition moves one computer, and a name
// that is no state changes nothing.
func TestComputersByState(t *testing.T) {
	m := New(nil)
	if n := testutil.CollectAndCount(m.computers); n != len(States) {
		t.Fatalf("a fresh registry exports %d state series, want %d", n, len(States))
	}
	m.SetComputers(map[string]int{api.StateRunning: 3, api.StateQueued: 1, "bogus": 7})
	m.Transition("", api.StateCreating)
	m.Transition(api.StateCreating, api.StateRunning)
	m.Transition(api.StateRunning, api.StateSuspended)
	m.Transition("bogus", "also-bogus")
	want := map[string]float64{api.StateQueued: 1, api.StateCreating: 0, api.StateRunning: 3,
		api.StateSuspended: 1, api.StateExpiring: 0, api.StateDeleted: 0, api.StateFailed: 0}
	for s, v := range want {
		if got := testutil.ToFloat64(m.computers.WithLabelValues(s)); got != v {
			t.Errorf("tether_computers{state=%q} = %v, want %v", s, got, v)
		}
	}
	if n := testutil.CollectAndCount(m.computers); n != len(States) {
		t.Errorf("a name that is no state made a series: %d series, want %d", n, len(States))
	}
}

// TestServiceMetrics: each setter reaches its series, and the histograms
// put an observation in the bucket its duration belongs to.
func TestServiceMetrics(t *testing.T) {
	m := New(nil)
	m.SetQueueLength(4)
	m.ObserveQueueWait(1500 * time.Millisecond)
	m.ObserveCreate(30 * time.Millisecond)
	m.ObserveCreate(3 * time.Second)
	m.ObserveResume(15 * time.Millisecond)
	m.SetPoolSize("small", 8)
	m.SetPoolSize("large", 2)
	m.LeaseExpired()
	m.LeaseExpired()
	if got := testutil.ToFloat64(m.queueLength); got != 4 {
		t.Errorf("queue length %v, want 4", got)
	}
	if got := testutil.ToFloat64(m.poolSize.WithLabelValues("small")); got != 8 {
		t.Errorf("pool size small %v, want 8", got)
	}
	if got := testutil.ToFloat64(m.leaseExpiries); got != 2 {
		t.Errorf("lease expiries %v, want 2", got)
	}
	const want = `
# HELP tether_create_seconds Time from a create leaving the queue to its computer running.
# TYPE tether_create_seconds histogram
tether_create_seconds_bucket{le="0.01"} 0
tether_create_seconds_bucket{le="0.02"} 0
tether_create_seconds_bucket{le="0.05"} 1
tether_create_seconds_bucket{le="0.1"} 1
tether_create_seconds_bucket{le="0.2"} 1
tether_create_seconds_bucket{le="0.5"} 1
tether_create_seconds_bucket{le="1"} 1
tether_create_seconds_bucket{le="2"} 1
tether_create_seconds_bucket{le="5"} 2
tether_create_seconds_bucket{le="10"} 2
tether_create_seconds_bucket{le="+Inf"} 2
tether_create_seconds_sum 3.03
tether_create_seconds_count 2
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "tether_create_seconds"); err != nil {
		t.Error(err)
	}
	for name, wantCount := range map[string]int{"tether_queue_wait_seconds": 1, "tether_resume_seconds": 1} {
		if n, err := testutil.GatherAndCount(m.Registry(), name); err != nil || n != wantCount {
			t.Errorf("%s: %d series, %v", name, n, err)
		}
	}
}

// TestUsageCollector: the collector calls the service's function at
// every scrape, with a context that has a deadline, and exports three
// series per computer; an id that is no valid label value fails the
// scrape (500) instead of panicking the server.
func TestUsageCollector(t *testing.T) {
	calls := 0
	reading := map[string]api.Usage{"c1": {CPUSeconds: 1.5, MemoryBytes: 1 << 20, Pids: 3}}
	m := New(func(ctx context.Context) map[string]api.Usage {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the usage function got a context without a deadline")
		}
		calls++
		return reading
	})
	const want = `
# HELP tether_computer_memory_bytes Memory the computer's cgroup uses now.
# TYPE tether_computer_memory_bytes gauge
tether_computer_memory_bytes{computer="c1"} 1.048576e+06
# HELP tether_computer_pids Processes and threads in the computer's cgroup now.
# TYPE tether_computer_pids gauge
tether_computer_pids{computer="c1"} 3
# HELP tether_computer_cpu_seconds_total CPU time the computer's cgroup has used.
# TYPE tether_computer_cpu_seconds_total counter
tether_computer_cpu_seconds_total{computer="c1"} 1.5
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"tether_computer_memory_bytes", "tether_computer_pids", "tether_computer_cpu_seconds_total"); err != nil {
		t.Error(err)
	}
	if calls != 1 {
		t.Errorf("usage function called %d times in one scrape", calls)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != 200 || !strings.Contains(string(body), `tether_computers{state="running"} 0`) {
		t.Errorf("handler: %d %q", rec.Code, body)
	}
	reading = map[string]api.Usage{"bad\xff": {}}
	rec = httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 500 {
		t.Errorf("an id that is not UTF-8: handler answered %d, want 500", rec.Code)
	}
}

// TestOwnRegistry: New never touches the process-wide default registry,
// so two services (or tests) in one process do not collide.
func TestOwnRegistry(t *testing.T) {
	before, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	New(nil)
	New(nil)
	after, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range after {
		if strings.HasPrefix(mf.GetName(), Namespace+"_") {
			t.Errorf("%s is in the default registry", mf.GetName())
		}
	}
	if len(after) != len(before) {
		t.Errorf("default registry went from %d to %d families", len(before), len(after))
	}
}
