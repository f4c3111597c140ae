package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The per-computer series, labelled by computer id.
var (
	cpuDesc = prometheus.NewDesc(Namespace+"_computer_cpu_seconds_total",
		"CPU time the computer's cgroup has used.", []string{"computer"}, nil)
	memoryDesc = prometheus.NewDesc(Namespace+"_computer_memory_bytes",
		"Memory the computer's cgroup uses now.", []string{"computer"}, nil)
	pidsDesc = prometheus.NewDesc(Namespace+"_computer_pids",
		"Processes and threads in the computer's cgroup now.", []string{"computer"}, nil)
)

// usageCollector reads the computers' cgroups when Prometheus scrapes,
// so a reading is never older than the scrape.
type usageCollector struct {
	usage   UsageFunc
	timeout time.Duration
}

var _ prometheus.Collector = (*usageCollector)(nil)

func newUsageCollector(usage UsageFunc, timeout time.Duration) *usageCollector {
	return &usageCollector{usage: usage, timeout: timeout}
}

// Describe sends the three per-computer descriptors.
func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cpuDesc
	ch <- memoryDesc
	ch <- pidsDesc
}

// Collect calls the UsageFunc and sends three series per computer.
// prometheus.Collector gives Collect no context, so the call gets its
// own, bounded by the collector's timeout.
func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	for id, u := range c.usage(ctx) {
		send(ch, cpuDesc, prometheus.CounterValue, u.CPUSeconds, id)
		send(ch, memoryDesc, prometheus.GaugeValue, float64(u.MemoryBytes), id)
		send(ch, pidsDesc, prometheus.GaugeValue, float64(u.Pids), id)
	}
}

// send sends one constant series, or an invalid metric (which fails the
// scrape with the reason) when id is no valid label value.
func send(ch chan<- prometheus.Metric, d *prometheus.Desc, t prometheus.ValueType, v float64, id string) {
	m, err := prometheus.NewConstMetric(d, t, v, id)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	ch <- m
}
