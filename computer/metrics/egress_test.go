package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestEgressCollector: each computer the proxy serves gets its open
// connections, bytes each way and refusals, read at the scrape.
func TestEgressCollector(t *testing.T) {
	m := New(nil)
	stats := map[string]EgressStats{"c-1": {Open: 2, BytesUp: 100, BytesDown: 5000, Refused: 3}}
	m.WatchEgress(func() map[string]EgressStats { return stats })
	want := `
# HELP tether_computer_egress_bytes_total Bytes through the egress proxy since it attached the computer; direction up is from the computer.
# TYPE tether_computer_egress_bytes_total counter
tether_computer_egress_bytes_total{computer="c-1",direction="down"} 5000
tether_computer_egress_bytes_total{computer="c-1",direction="up"} 100
# HELP tether_computer_egress_connections Connections the computer holds open through the egress proxy now.
# TYPE tether_computer_egress_connections gauge
tether_computer_egress_connections{computer="c-1"} 2
# HELP tether_computer_egress_refusals_total Connections the egress proxy refused since it attached the computer.
# TYPE tether_computer_egress_refusals_total counter
tether_computer_egress_refusals_total{computer="c-1"} 3
`
	names := []string{"tether_computer_egress_bytes_total", "tether_computer_egress_connections", "tether_computer_egress_refusals_total"}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	stats = map[string]EgressStats{}
	if n, err := testutil.GatherAndCount(m.Registry(), names...); err != nil || n != 0 {
		t.Fatalf("after the computer left: %d series, %v", n, err)
	}
}
