package egress_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/policy"
)

// bigUpstream serves n zero bytes at every path.
func bigUpstream(t testing.TB, n int) *upstream {
	zeros := make([]byte, 64<<10)
	return startUpstream(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(n))
		for left := n; left > 0; left -= len(zeros) {
			if _, err := w.Write(zeros[:min(left, len(zeros))]); err != nil {
				return
			}
		}
	}))
}

// download fetches url through proxy and returns the bytes and time.
func download(proxy, target string) (int64, time.Duration, error) {
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxy}),
		DisableKeepAlives: true}}
	start := time.Now()
	resp, err := c.Get(target)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	return n, time.Since(start), err
}

// TestAttackFloodAndSlowlorisKeepFairShare: computer A opens 10,000
// connections and keeps slowloris connections dribbling a header while
// computer B downloads; B keeps its share (within 2x its time alone, in
// the same run), and A never holds more than its connection limit.
func TestAttackFloodAndSlowlorisKeepFairShare(t *testing.T) {
	const size = 8 << 20
	up := bigUpstream(t, size)
	l := newLab(t, egress.Config{Limits: egress.Limits{Conns: 64, BytesPerSecond: 16 << 20}, HeaderTimeout: time.Second})
	a, _ := l.attach(t, "a", allowPort(up.port, "lab"))
	b, _ := l.attach(t, "b", allowPort(up.port, "lab"))
	target := fmt.Sprintf("http://127.0.0.1:%d/", up.port)
	alone := time.Duration(1 << 62)
	for i := 0; i < 2; i++ {
		n, d, err := download(b, target)
		if err != nil || n != size {
			t.Fatalf("B alone: %d bytes, %v", n, err)
		}
		alone = min(alone, d)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var opened, maxOpen atomic.Int64
	flood(&wg, stop, a, 10000, &opened)
	slowloris(&wg, stop, a, 64)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if s, _ := l.p.Stats("a"); s.Open > maxOpen.Load() {
				maxOpen.Store(s.Open)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	waitFor(t, "the flood to be under way", 60*time.Second, func() bool { s, _ := l.p.Stats("a"); return s.Refused > 500 })
	n, during, err := download(b, target)
	waitFor(t, "10,000 connections from A", 120*time.Second, func() bool { return opened.Load() >= 10000 })
	close(stop)
	wg.Wait()
	if err != nil || n != size {
		t.Fatalf("B during the flood: %d bytes, %v", n, err)
	}
	sa, _ := l.p.Stats("a")
	t.Logf("B alone %v, during A's flood %v (%.2fx); A: %d connections made, %d refused, at most %d open",
		alone, during, float64(during)/float64(alone), opened.Load(), sa.Refused, maxOpen.Load())
	if during > 2*alone+200*time.Millisecond {
		t.Errorf("B's download took %v during A's flood, %v alone: more than 2x", during, alone)
	}
	if maxOpen.Load() > 64+1 {
		t.Errorf("A held %d connections open, its limit is 64", maxOpen.Load())
	}
}

// flood opens n connections to proxy from 50 goroutines, holding each
// until stop.
func flood(wg *sync.WaitGroup, stop chan struct{}, proxy string, n int, opened *atomic.Int64) {
	const workers = 50
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for i := 0; i < n/workers; i++ {
				c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
				if err == nil {
					held = append(held, c)
					opened.Add(1)
				}
				select {
				case <-stop:
					return
				default:
				}
			}
			<-stop
		}()
	}
}

// slowloris keeps k connections dribbling a request head, one byte at a
// time, reopening each as the proxy closes it.
func slowloris(wg *sync.WaitGroup, stop chan struct{}, proxy string, k int) {
	for i := 0; i < k; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := net.Dial("tcp", proxy)
				if err != nil {
					return
				}
				for err == nil {
					select {
					case <-stop:
						c.Close()
						return
					case <-time.After(100 * time.Millisecond):
					}
					_, err = c.Write([]byte("G"))
				}
				c.Close()
			}
		}()
	}
}

// TestSlowlorisHeaderDeadline: a connection that never finishes its
// request head is closed at HeaderTimeout; with a long timeout (the
// positive control) the same connection stays open.
func TestSlowlorisHeaderDeadline(t *testing.T) {
	for _, tc := range []struct {
		timeout time.Duration
		closed  bool
	}{{300 * time.Millisecond, true}, {time.Hour, false}} {
		l := newLab(t, egress.Config{HeaderTimeout: tc.timeout})
		proxy, ref := l.attach(t, "a", policy.Policy{})
		c, err := net.Dial("tcp", proxy)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET http://pypi.org/ HTTP/1.1\r\nX: ")
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		timedOut := false
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			timedOut = true
		}
		if timedOut == tc.closed {
			t.Errorf("HeaderTimeout %v: read %v, want closed %v", tc.timeout, err, tc.closed)
		}
		if tc.closed {
			if r := ref.next(t); r.Check != policy.CheckProtocol {
				t.Errorf("refusal %+v", r)
			}
		}
	}
}

// TestLimitConnections: the connection over the limit is refused at
// once; when one closes, the next is served.
func TestLimitConnections(t *testing.T) {
	l := newLab(t, egress.Config{Limits: egress.Limits{Conns: 4}})
	proxy, ref := l.attach(t, "a", policy.Policy{})
	var held []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", proxy)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	waitFor(t, "4 open", 5*time.Second, func() bool { s, _ := l.p.Stats("a"); return s.Open == 4 })
	extra, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the 5th connection: %v, want EOF", err)
	}
	if r := ref.next(t); r.Check != policy.CheckLimit {
		t.Errorf("refusal %+v", r)
	}
	held[0].Close()
	waitFor(t, "3 open", 5*time.Second, func() bool { s, _ := l.p.Stats("a"); return s.Open == 3 })
	if status, _ := rawHTTP(t, proxy, get("pypi.org", 80)); !strings.HasPrefix(status, "403 ") {
		t.Errorf("after one closed, a request is not answered: %s", status)
	}
	if r := ref.next(t); r.Check != policy.CheckPolicy {
		t.Errorf("refusal %+v, want the policy's", r)
	}
}

// TestLimitTotalBytes: a download past the computer's total is cut and
// the next connection refused; a computer under its total (the positive
// control) downloads the same.
func TestLimitTotalBytes(t *testing.T) {
	up := bigUpstream(t, 4<<20)
	l := newLab(t, egress.Config{Limits: egress.Limits{TotalBytes: 1 << 20, BytesPerSecond: -1}})
	small, ref := l.attach(t, "small", allowPort(up.port, "lab"))
	target := fmt.Sprintf("http://127.0.0.1:%d/", up.port)
	if n, _, err := download(small, target); err == nil && n == 4<<20 {
		t.Fatalf("downloaded %d bytes past a total of 1 MiB", n)
	}
	if r := ref.next(t); r.Check != policy.CheckLimit {
		t.Errorf("refusal %+v", r)
	}
	if status, _ := rawHTTP(t, small, get("127.0.0.1", up.port)); !strings.HasPrefix(status, "5") && !strings.HasPrefix(status, "4") {
		t.Errorf("after the total: %s", status)
	}
	l2 := newLab(t, egress.Config{Limits: egress.Limits{BytesPerSecond: -1}})
	big, _ := l2.attach(t, "big", allowPort(up.port, "lab"))
	if n, _, err := download(big, target); err != nil || n != 4<<20 {
		t.Fatalf("positive control: %d bytes, %v", n, err)
	}
}

// TestDetachClosesEverything: Detach closes the listener and an open
// tunnel before it returns, and forgets the computer.
func TestDetachClosesEverything(t *testing.T) {
	echo := startEcho(t)
	l := newLab(t, egress.Config{})
	pol := allowPort(echo.port, "lab")
	pol.AllowNoSNI = true
	proxy, _ := l.attach(t, "a", pol)
	conn, br, status := connect(t, proxy, hostPortStr("127.0.0.1", echo.port))
	if !strings.HasPrefix(status, "200 ") {
		t.Fatal(status)
	}
	io.WriteString(conn, "x")
	if b, err := br.ReadByte(); err != nil || b != 'x' {
		t.Fatalf("echo: %q %v", b, err)
	}
	if err := l.p.Detach(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("the tunnel after Detach: %v, want EOF", err)
	}
	if c, err := net.Dial("tcp", proxy); err == nil {
		c.Close()
		t.Error("the listener still accepts after Detach")
	}
	if _, ok := l.p.Stats("a"); ok {
		t.Error("Stats knows a detached computer")
	}
	if err := l.p.Detach(context.Background(), "a"); err != nil {
		t.Errorf("Detach twice: %v", err)
	}
}

// TestFloodWithoutConnLimit is the flood's positive control: with no
// connection limit the same flood holds far more than 64 connections
// open on the proxy.
func TestFloodWithoutConnLimit(t *testing.T) {
	l := newLab(t, egress.Config{Limits: egress.Limits{Conns: -1}})
	a, _ := l.attach(t, "a", policy.Policy{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var opened atomic.Int64
	flood(&wg, stop, a, 1000, &opened)
	waitFor(t, "more than 64 open", 60*time.Second, func() bool { s, _ := l.p.Stats("a"); return s.Open > 64 })
	close(stop)
	wg.Wait()
}

// TestLimitBytesPerSecond: a 4 MiB download under 8 MiB/s (burst 1 MiB)
// takes at least the 3 MiB past the burst at the rate, 375 ms; without
// the limit (positive control) the same download is faster than that.
func TestLimitBytesPerSecond(t *testing.T) {
	up := bigUpstream(t, 4<<20)
	target := fmt.Sprintf("http://127.0.0.1:%d/", up.port)
	limited := newLab(t, egress.Config{Limits: egress.Limits{BytesPerSecond: 8 << 20}})
	slow, _ := limited.attach(t, "slow", allowPort(up.port, "lab"))
	n, d, err := download(slow, target)
	if err != nil || n != 4<<20 || d < 375*time.Millisecond {
		t.Fatalf("under 8 MiB/s: %d bytes in %v, %v; want 4 MiB in at least 375 ms", n, d, err)
	}
	free := newLab(t, egress.Config{Limits: egress.Limits{BytesPerSecond: -1}})
	fast, _ := free.attach(t, "fast", allowPort(up.port, "lab"))
	n, d2, err := download(fast, target)
	if err != nil || n != 4<<20 || d2 >= 375*time.Millisecond {
		t.Fatalf("positive control, no limit: %d bytes in %v, %v", n, d2, err)
	}
	t.Logf("4 MiB at 8 MiB/s: %v; unlimited: %v", d, d2)
}
