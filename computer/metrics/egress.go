package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// EgressStats are one computer's counters at the host's egress proxy
// (egress.Proxy.Stats), since the proxy attached it.
type EgressStats struct {
	Open      int64 // connections open now
	BytesUp   int64 // computer to destinations
	BytesDown int64 // destinations to computer
	Refused   int64 // connections refused
}

// EgressFunc returns the egress counters of every computer the proxy
// serves, keyed by computer id. It is called once per scrape.
type EgressFunc func() map[string]EgressStats

// The per-computer egress series.
var (
	egressOpenDesc = prometheus.NewDesc(Namespace+"_computer_egress_connections",
		"Connections the computer holds open through the egress proxy now.", []string{"computer"}, nil)
	egressBytesDesc = prometheus.NewDesc(Namespace+"_computer_egress_bytes_total",
		"Bytes through the egress proxy since it attached the computer; direction up is from the computer.",
		[]string{"computer", "direction"}, nil)
	egressRefusedDesc = prometheus.NewDesc(Namespace+"_computer_egress_refusals_total",
		"Connections the egress proxy refused since it attached the computer.", []string{"computer"}, nil)
)

// egressCollector reads the proxy's counters when Prometheus scrapes.
type egressCollector struct{ stats EgressFunc }

var _ prometheus.Collector = egressCollector{}

// WatchEgress registers the per-computer egress series, read from stats
// at every scrape. Call it at most once.
func (m *Metrics) WatchEgress(stats EgressFunc) {
	m.reg.MustRegister(egressCollector{stats})
}

// Describe sends the egress descriptors.
func (c egressCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- egressOpenDesc
	ch <- egressBytesDesc
	ch <- egressRefusedDesc
}

// Collect sends four series per computer.
func (c egressCollector) Collect(ch chan<- prometheus.Metric) {
	for id, s := range c.stats() {
		send(ch, egressOpenDesc, prometheus.GaugeValue, float64(s.Open), id)
		sendLabels(ch, egressBytesDesc, prometheus.CounterValue, float64(s.BytesUp), id, "up")
		sendLabels(ch, egressBytesDesc, prometheus.CounterValue, float64(s.BytesDown), id, "down")
		send(ch, egressRefusedDesc, prometheus.CounterValue, float64(s.Refused), id)
	}
}

// sendLabels is send with several label values.
func sendLabels(ch chan<- prometheus.Metric, d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
	m, err := prometheus.NewConstMetric(d, t, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	ch <- m
}
