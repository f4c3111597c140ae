package view

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/digitalocean/go-qemu/qmp"

	"github.com/tetherdev/tether/fixtures/browser"
	"github.com/tetherdev/tether/qmpinput/token"
)

// The figures of the live view (docs/qmpinput.md), measured under TCG on
// the 1280x800 guest with Debian's chromium. Each benchmark takes a fixed
// number of samples per b.N, so -benchtime 1x still gives percentiles.

func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(math.Ceil(p*float64(len(s))))-1]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// watchJS installs a watcher that records (Date.now) when the canvas
// strip of the drawn row (pixels 32..47) changes after being armed.
const watchJS = `(() => {
	const c = document.querySelector("#screen canvas");
	const strip = () => {
		const d = c.getContext("2d").getImageData(0, 32, c.width, 16).data;
		let h = 2166136261;
		for (let i = 0; i < d.length; i += 4) h = Math.imul(h ^ (d[i] | d[i+1] << 8 | d[i+2] << 16), 16777619);
		return h >>> 0;
	};
	window.__w = {armed: false, base: 0, at: 0, arm() { this.base = strip(); this.at = 0; this.armed = true; }};
	setInterval(() => {
		if (__w.armed && strip() !== __w.base) { __w.at = Date.now(); __w.armed = false; }
	}, 2);
	return true;
})()`

// latencySamples draws n markers with random idle gaps and returns, per
// draw, the time from the guest having drawn (its serial answer) to the
// canvas showing it, and from the host's command to the canvas.
func latencySamples(b *testing.B, e *env, br *browser.Browser, n int) (drawn, cmd []time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for range n {
		time.Sleep(time.Duration(200+rand.IntN(1300)) * time.Millisecond) // idle gaps let QEMU's refresh back off
		browser.Eval[bool](b, br, "(__w.arm(), true)")
		sent := time.Now()
		if _, err := e.vm.Draw(ctx); err != nil {
			b.Fatal(err)
		}
		answered := time.Now()
		br.Poll(b, "the canvas change", "__w.at > 0", 30*time.Second)
		at := time.UnixMilli(int64(browser.Eval[float64](b, br, "__w.at")))
		drawn = append(drawn, max(at.Sub(answered), 0))
		cmd = append(cmd, at.Sub(sent))
	}
	return drawn, cmd
}

// BenchmarkUpdateLatency: a change on the guest's screen reaches the
// browser canvas (target p95 <= 300 ms). Baseline: the same proxy without
// its refresh nudge, where QEMU's refresh backs off on a still screen.
func BenchmarkUpdateLatency(b *testing.B) {
	const samples = 20
	for _, c := range []struct {
		name    string
		refresh time.Duration
	}{{"proxy", 0}, {"baseline-no-nudge", -1}} {
		b.Run(c.name, func(b *testing.B) {
			e := newEnv(b, func(cfg *Config) { cfg.RefreshEvery = c.refresh })
			br := browser.New(b, 1280, 1000)
			_, secret := e.mint(b, token.RoleView, time.Hour, "bench")
			br.OpenView(b, e.link(secret))
			browser.Eval[bool](b, br, watchJS)
			var drawn, cmd []time.Duration
			for b.Loop() {
				d, c := latencySamples(b, e, br, samples)
				drawn, cmd = append(drawn, d...), append(cmd, c...)
			}
			b.ReportMetric(ms(percentile(drawn, 0.5)), "p50-ms")
			b.ReportMetric(ms(percentile(drawn, 0.95)), "p95-ms")
			b.ReportMetric(ms(percentile(cmd, 0.95)), "cmd-to-canvas-p95-ms")
		})
	}
}

// BenchmarkIdleBandwidth: what a still screen costs one viewer (target
// <= 2 KB/s): bytes the proxy sent the browser over 10 s of a still
// screen, after the first full frame.
func BenchmarkIdleBandwidth(b *testing.B) {
	e := newEnv(b, nil)
	br := browser.New(b, 1280, 1000)
	tok, secret := e.mint(b, token.RoleView, time.Hour, "bench")
	br.OpenView(b, e.link(secret))
	v := e.viewerOf(tok.ID)
	var rate float64
	for b.Loop() {
		br.Poll(b, "a settled screen", stableExpr(browser.CanvasHash(0, 0, 1280, 800), 1000), 30*time.Second)
		start, t0 := v.stats().ToViewer.Load(), time.Now()
		time.Sleep(10 * time.Second) // the window being measured
		rate = float64(v.stats().ToViewer.Load()-start) / time.Since(t0).Seconds()
	}
	b.ReportMetric(rate, "idle-B/s")
}

// BenchmarkTakeover: from the take-over click to agent input fenced
// (Handover.Begin returned: fence set, the agent's command in flight
// finished), while the agent types (target p95 <= 100 ms).
func BenchmarkTakeover(b *testing.B) {
	const samples = 20
	e := newEnv(b, nil)
	br := browser.New(b, 1280, 1000)
	_, secret := e.mint(b, token.RoleControl, time.Hour, "bench")
	br.OpenView(b, e.link(secret))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // a busy agent: one key after another
		for ctx.Err() == nil {
			e.adapter.Key(ctx, "shift")
		}
	}()
	var ds []time.Duration
	for b.Loop() {
		for range samples {
			ds = append(ds, takeoverOnce(b, e, br, ctx))
		}
	}
	b.ReportMetric(ms(percentile(ds, 0.5)), "p50-ms")
	b.ReportMetric(ms(percentile(ds, 0.95)), "p95-ms")
}

func takeoverOnce(b *testing.B, e *env, br *browser.Browser, ctx context.Context) time.Duration {
	br.Poll(b, "the take over button", `!document.getElementById("takeover").hidden`, 30*time.Second)
	xy := browser.Eval[[]float64](b, br, `(() => { const r = document.getElementById("takeover").getBoundingClientRect(); return [r.x + r.width/2, r.y + r.height/2]; })()`)
	for len(e.begins) > 0 {
		<-e.begins
	}
	clicked := time.Now()
	br.Do(b, 10*time.Second, chromedp.MouseClickXY(xy[0], xy[1]))
	var fenced time.Time
	select {
	case fenced = <-e.begins:
	case <-time.After(30 * time.Second):
		b.Fatal("no handover began")
	}
	if err := e.adapter.Key(ctx, "shift"); err == nil {
		b.Fatal("agent input not fenced after the take over")
	}
	br.Poll(b, "the hand back button", `!document.getElementById("handback").hidden`, 30*time.Second)
	br.Do(b, 10*time.Second, chromedp.Click(chromedp.CSS("#handback")))
	return fenced.Sub(clicked)
}

// BenchmarkTypingBytes: bytes per minute of typing at 5 characters a
// second, as the live stream carries it, against the same screen sent as
// one PNG capture per typed character (the baseline a screendump design
// would need at least).
func BenchmarkTypingBytes(b *testing.B) {
	const chars = 30
	e := newEnv(b, nil)
	br := browser.New(b, 1280, 1000)
	tok, secret := e.mint(b, token.RoleView, time.Hour, "bench")
	br.OpenView(b, e.link(secret))
	v := e.viewerOf(tok.ID)
	probe, err := newProbe(e.vm)
	if err != nil {
		b.Fatal(err)
	}
	defer probe.Disconnect()
	pngPath := e.state + "/probe.png"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stream, pngs int64
	var took time.Duration
	for b.Loop() {
		br.Poll(b, "a settled screen", stableExpr(browser.CanvasHash(0, 0, 1280, 800), 1000), 30*time.Second)
		start, t0 := v.stats().ToViewer.Load(), time.Now()
		for i := range chars {
			if err := e.adapter.Type(ctx, string(rune('a'+i%26))); err != nil {
				b.Fatal(err)
			}
			pngs += screendumpSize(b, probe, pngPath)
			time.Sleep(200 * time.Millisecond) // 5 characters a second
		}
		took = time.Since(t0)
		stream += v.stats().ToViewer.Load() - start
	}
	perMin := func(n int64) float64 { return float64(n) / took.Minutes() / float64(b.N) }
	b.ReportMetric(perMin(stream), "stream-B/min")
	b.ReportMetric(perMin(pngs), "png-B/min")
	b.ReportMetric(float64(pngs)/math.Max(float64(stream), 1), "png/stream")
}

// screendumpSize has QEMU write a PNG of the screen through the test's
// probe socket and returns its size.
func screendumpSize(b *testing.B, mon *qmp.SocketMonitor, path string) int64 {
	cmd, _ := json.Marshal(map[string]any{"execute": "screendump", "arguments": map[string]string{"filename": path, "format": "png"}})
	if _, err := mon.Run(cmd); err != nil {
		b.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return st.Size()
}
