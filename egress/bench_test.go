package egress_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/egress"
)

// median of ds (sorted in place).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// BenchmarkDownload64MiB: one 64 MiB download per round through the
// proxy (absolute-form HTTP, no rate limit) and directly from the same
// loopback server, in alternating order; reports the p50 of each and the
// ratio of their throughputs.
func BenchmarkDownload64MiB(b *testing.B) {
	const size = 64 << 20
	up := bigUpstream(b, size)
	l := newLab(b, egress.Config{Limits: egress.Limits{BytesPerSecond: -1}})
	proxy, _ := l.attach(b, "bench", allowPort(up.port, "lab"))
	target := fmt.Sprintf("http://127.0.0.1:%d/", up.port)
	direct := func() (int64, time.Duration, error) {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		start := time.Now()
		resp, err := c.Get(target)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		return n, time.Since(start), err
	}
	var viaProxy, straight []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < 2; j++ {
			var n int64
			var d time.Duration
			var err error
			if (i+j)%2 == 0 {
				n, d, err = download(proxy, target)
				viaProxy = append(viaProxy, d)
			} else {
				n, d, err = direct()
				straight = append(straight, d)
			}
			if err != nil || n != size {
				b.Fatalf("download: %d bytes, %v", n, err)
			}
		}
	}
	p, d := median(viaProxy), median(straight)
	ratio := float64(d) / float64(p)
	b.ReportMetric(float64(size)/(1<<20)/p.Seconds(), "proxy-MiB/s")
	b.ReportMetric(float64(size)/(1<<20)/d.Seconds(), "direct-MiB/s")
	b.ReportMetric(ratio, "proxy/direct-throughput")
	fmt.Printf("egress 64 MiB download = %.2fx direct (%.0f against %.0f MiB/s; goal >= 0.8x)\n",
		ratio, float64(size)/(1<<20)/p.Seconds(), float64(size)/(1<<20)/d.Seconds())
}

// firstByte opens a new connection to addr, sends req and returns the
// time until the first byte of the answer.
func firstByte(addr, req string) (time.Duration, error) {
	start := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		return 0, err
	}
	br := bufio.NewReader(c)
	if _, err := br.ReadByte(); err != nil {
		return 0, err
	}
	d := time.Since(start)
	io.Copy(io.Discard, br)
	return d, nil
}

// BenchmarkTimeToFirstByte: per round, a new connection and a small GET
// through the proxy (a name resolved by a DNS server on loopback, as a
// client would resolve it directly) and a new connection straight to the
// server (resolving the same name); reports the p50 of each and the p50
// of the time the proxy adds.
func BenchmarkTimeToFirstByte(b *testing.B) {
	up := startUpstream(b, "127.0.0.1:0", nil)
	d := staticDNS(b, map[string][]string{"up.test": {"127.0.0.1"}})
	l := newLab(b, egress.Config{DNS: d.addr})
	proxy, _ := l.attach(b, "bench", allowPort(up.port, "lab"))
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, d.addr)
	}}
	hp := hostPortStr("up.test", up.port)
	proxied := fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hp, hp)
	plain := fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hp)
	var viaProxy, straight, added []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tp, err := firstByte(proxy, proxied)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		addrs, err := resolver.LookupNetIP(b.Context(), "ip", "up.test.")
		if err != nil || len(addrs) == 0 {
			b.Fatal(err)
		}
		if _, err := firstByte(fmt.Sprintf("%s:%d", addrs[0], up.port), plain); err != nil {
			b.Fatal(err)
		}
		td := time.Since(start)
		viaProxy, straight, added = append(viaProxy, tp), append(straight, td), append(added, tp-td)
	}
	p, s, a := median(viaProxy), median(straight), median(added)
	b.ReportMetric(float64(p.Microseconds()), "proxy-p50-µs")
	b.ReportMetric(float64(s.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(a.Microseconds()), "added-p50-µs")
	fmt.Printf("egress added time to first byte p50 = %.2f ms (%.2f against %.2f ms; goal <= 1 ms)\n",
		float64(a.Microseconds())/1000, float64(p.Microseconds())/1000, float64(s.Microseconds())/1000)
}

// BenchmarkIdleTunnels1000: the memory 1,000 open, idle CONNECT tunnels
// hold in the proxy's process (Go heap and stacks, after a GC), against
// the same process before they opened. The upstream holds its
// connections without a goroutine each, so it adds little. Run it 1x:
// a later round starts with the first round's buffers in the pool.
func BenchmarkIdleTunnels1000(b *testing.B) {
	const n = 1000
	for i := 0; i < b.N; i++ {
		heldUp := holdListener(b)
		l := newLab(b, egress.Config{Limits: egress.Limits{Conns: 2 * n}})
		pol := allowPort(heldUp.port, "lab")
		pol.AllowNoSNI = true
		proxy, _ := l.attach(b, "bench", pol)
		before := inUse()
		var conns []net.Conn
		for j := 0; j < n; j++ {
			c, br, status := connect(b, proxy, hostPortStr("127.0.0.1", heldUp.port))
			if !strings.HasPrefix(status, "200 ") || br.Buffered() != 0 {
				b.Fatal(status)
			}
			io.WriteString(c, "x")
			conns = append(conns, c)
		}
		waitFor(b, "every tunnel past its first byte", 30*time.Second, func() bool {
			s, _ := l.p.Stats("bench")
			return s.BytesUp == n
		})
		after := inUse()
		per := float64(after-before) / n
		b.ReportMetric(per/1024, "KiB/tunnel")
		fmt.Printf("egress 1,000 idle tunnels hold %.1f MiB (%.1f KiB each)\n", float64(after-before)/(1<<20), per/1024)
		for _, c := range conns {
			c.Close()
		}
		heldUp.close()
	}
}

// inUse is the Go heap and stack in use after a GC.
func inUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// heldListener accepts connections and keeps them, unread.
type heldListener struct {
	port  uint16
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func holdListener(b testing.TB) *heldListener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	h := &heldListener{ln: ln, port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
		}
	}()
	return h
}

func (h *heldListener) close() {
	h.ln.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
}
