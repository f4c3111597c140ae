package qmpinput

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// BenchmarkCapture1080p measures a 1920x1080 PNG capture under TCG through
// the adapter (pins, private dir, PNG check, SHA-256, pool) against the
// baseline of go-qemu's plain SocketMonitor running the same screendump
// and reading the file, on the same guest in the same run. It reports
// p50 and p95 in milliseconds.
func BenchmarkCapture1080p(b *testing.B) {
	tv := sharedVM(b)
	b.Run("adapter", func(b *testing.B) {
		a := openReal(b, tv, nil)
		ctx := context.Background()
		lat := measure(b, func() error { _, err := a.Capture(ctx); return err })
		reportPercentiles(b, lat)
	})
	b.Run("go-qemu-baseline", func(b *testing.B) {
		mon := baselineMonitor(b, tv)
		dir := b.TempDir()
		cmd, _ := json.Marshal(qmp.Command{Execute: "screendump", Args: screendumpArgs{
			Filename: filepath.Join(dir, "f.png"), Device: "video0", Format: "png"}})
		lat := measure(b, func() error {
			if _, err := mon.Run(cmd); err != nil {
				return err
			}
			_, err := os.ReadFile(filepath.Join(dir, "f.png"))
			return err
		})
		reportPercentiles(b, lat)
	})
}

// BenchmarkType100 types 100 characters: through the adapter with its
// default rate limit (20/s), through the adapter unthrottled, and as the
// baseline of the same 200 input-send-event commands over go-qemu.
func BenchmarkType100(b *testing.B) {
	tv := sharedVM(b)
	text := strings.Repeat("The quick brown fox, 0123456789! ", 4)[:100]
	b.Run("adapter-rate-limited", func(b *testing.B) {
		a := openReal(b, tv, nil) // defaults: 20 characters/s, burst 10, 10 ms hold
		reportPercentiles(b, measure(b, func() error { return a.Type(context.Background(), text) }))
	})
	b.Run("adapter-unthrottled", func(b *testing.B) {
		a := openReal(b, tv, func(c *Config) { c.TypeRate, c.TypeBurst, c.PressHold = 1e9, 1000, time.Nanosecond })
		reportPercentiles(b, measure(b, func() error { return a.Type(context.Background(), text) }))
	})
	b.Run("go-qemu-baseline", func(b *testing.B) {
		mon := baselineMonitor(b, tv)
		keys, err := layout(text)
		if err != nil {
			b.Fatal(err)
		}
		reportPercentiles(b, measure(b, func() error {
			for _, k := range keys {
				for _, down := range []bool{true, false} {
					cmd := fmt.Sprintf(`{"execute":"input-send-event","arguments":{"events":[{"type":"key","data":{"down":%v,"key":{"type":"qcode","data":%q}}}]}}`, down, k.code.String())
					if _, err := mon.Run([]byte(cmd)); err != nil {
						return err
					}
				}
			}
			return nil
		}))
	})
}

func baselineMonitor(b *testing.B, tv *testVM) *qmp.SocketMonitor {
	mon, err := qmp.NewSocketMonitor("unix", tv.base, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	if err := mon.Connect(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mon.Disconnect() })
	return mon
}

func measure(b *testing.B, op func() error) []time.Duration {
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	return lat
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		i := int(float64(len(lat)-1) * p)
		return float64(lat[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.95), "p95-ms")
}
