// Package metrics is the computer service's Prometheus metrics: one
// registry of its own (never the process-wide default), the service's
// counters, gauges and histograms, and a collector that reads every
// computer's CPU, memory and pids from its cgroups when Prometheus
// scrapes. Handler serves the registry; docs/operations.md ("Metrics")
// lists every series.
package metrics

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tetherdev/tether/computer/api"
)

// Namespace prefixes every metric name.
const Namespace = "tether"

// States are the values of the state label of tether_computers: every
// state of the lifecycle, each exported (at zero) from the start.
var States = []string{api.StateQueued, api.StateCreating, api.StateRunning, api.StateSuspended,
	api.StateExpiring, api.StateDeleted, api.StateFailed}

// LatencyBuckets are the buckets of the latency histograms, in seconds:
// 10 ms to 10 s, about three per decade.
var LatencyBuckets = []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10}

// QueueWaitBuckets are the buckets of the queue wait histogram, in
// seconds: 10 ms to 10 minutes, since a create may wait that long.
var QueueWaitBuckets = []float64{0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600}

// Metrics holds the service's metrics and their registry. Its methods may
// be called from several goroutines.
type Metrics struct {
	reg           *prometheus.Registry
	computers     *prometheus.GaugeVec
	queueLength   prometheus.Gauge
	queueWait     prometheus.Histogram
	createLatency prometheus.Histogram
	resumeLatency prometheus.Histogram
	poolSize      *prometheus.GaugeVec
	leaseExpiries prometheus.Counter
}

// New makes the metrics in a fresh registry. usage, when not nil, is
// called at every scrape for the per-computer cgroup readings (see
// UsageFunc); nil exports no per-computer series.
func New(usage UsageFunc) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		computers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "computers",
			Help: "Computers by lifecycle state."}, []string{"state"}),
		queueLength: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "queue_length",
			Help: "Creates waiting in the capacity queue."}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "queue_wait_seconds",
			Help: "Time a create waited in the capacity queue.", Buckets: QueueWaitBuckets}),
		createLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "create_seconds",
			Help: "Time from a create leaving the queue to its computer running.", Buckets: LatencyBuckets}),
		resumeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "resume_seconds",
			Help: "Time to thaw a suspended computer.", Buckets: LatencyBuckets}),
		poolSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "pool_size",
			Help: "Prepared computers in the warm pool, by limits profile."}, []string{"profile"}),
		leaseExpiries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "lease_expiries_total",
			Help: "Computers ended because their lease expired."}),
	}
	for _, s := range States {
		m.computers.WithLabelValues(s).Set(0)
	}
	m.reg.MustRegister(m.computers, m.queueLength, m.queueWait, m.createLatency, m.resumeLatency,
		m.poolSize, m.leaseExpiries)
	if usage != nil {
		m.reg.MustRegister(newUsageCollector(usage, DefaultUsageTimeout))
	}
	return m
}

// Registry returns the registry, for a caller that gathers it itself.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats. A
// failing collector answers 500 rather than a partial page.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError})
}

// SetComputers sets tether_computers for every state from counts; a
// state counts names no computer is set to zero. Counts for a name that
// is not a state are ignored.
func (m *Metrics) SetComputers(counts map[string]int) {
	for _, s := range States {
		m.computers.WithLabelValues(s).Set(float64(counts[s]))
	}
}

// Transition moves one computer from state from to state to; an empty
// from (a new computer) or to (one forgotten) moves nothing on that side.
// A name that is not a state is ignored.
func (m *Metrics) Transition(from, to string) {
	if isState(from) {
		m.computers.WithLabelValues(from).Dec()
	}
	if isState(to) {
		m.computers.WithLabelValues(to).Inc()
	}
}

func isState(s string) bool { return slices.Contains(States, s) }

// SetQueueLength sets how many creates wait in the queue.
func (m *Metrics) SetQueueLength(n int) { m.queueLength.Set(float64(n)) }

// ObserveQueueWait records how long a create waited in the queue.
func (m *Metrics) ObserveQueueWait(d time.Duration) { m.queueWait.Observe(d.Seconds()) }

// ObserveCreate records how long a create took once out of the queue.
func (m *Metrics) ObserveCreate(d time.Duration) { m.createLatency.Observe(d.Seconds()) }

// ObserveResume records how long a resume took.
func (m *Metrics) ObserveResume(d time.Duration) { m.resumeLatency.Observe(d.Seconds()) }

// SetPoolSize sets how many prepared computers the pool of profile holds.
func (m *Metrics) SetPoolSize(profile string, n int) {
	m.poolSize.WithLabelValues(profile).Set(float64(n))
}

// LeaseExpired counts one computer ended by its lease.
func (m *Metrics) LeaseExpired() { m.leaseExpiries.Inc() }

// DefaultUsageTimeout bounds one scrape's call of the UsageFunc.
const DefaultUsageTimeout = 5 * time.Second

// UsageFunc returns the current cgroup reading of every live computer,
// keyed by computer id. It is called once per scrape with a context that
// ends after DefaultUsageTimeout; a computer it cannot read is left out.
type UsageFunc func(ctx context.Context) map[string]api.Usage
