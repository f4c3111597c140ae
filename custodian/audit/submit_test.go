package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/tetherdev/tether/fixtures/witness"
)

// gate is a loopback TCP proxy in front of a real witness process: while
// down it closes every connection at once (a witness that is down); with
// hang it holds every connection open without answering (a witness that
// hangs).
type gate struct {
	ln     net.Listener
	target string
	up     atomic.Bool
	hang   bool
	conns  atomic.Int64
	mu     sync.Mutex
	held   []net.Conn
}

func startGate(t *testing.T, target string, hang bool) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: strings.TrimPrefix(target, "http://"), hang: hang}
	t.Cleanup(g.close)
	go g.serve()
	return g
}

func (g *gate) URL() string { return "http://" + g.ln.Addr().String() }

func (g *gate) serve() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.conns.Add(1)
		switch {
		case g.hang:
			g.mu.Lock()
			g.held = append(g.held, c)
			g.mu.Unlock()
		case !g.up.Load():
			c.Close()
		default:
			go g.pipe(c)
		}
	}
}

func (g *gate) pipe(c net.Conn) {
	defer c.Close()
	d, err := net.Dial("tcp", g.target)
	if err != nil {
		return
	}
	defer d.Close()
	go io.Copy(d, c)
	io.Copy(c, d)
}

func (g *gate) close() {
	g.ln.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.held {
		c.Close()
	}
}

// syncLog is a log buffer safe to read while the submitter writes it.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncLog) count(substrs ...string) int {
	n := 0
	for _, line := range strings.Split(s.String(), "\n") {
		all := true
		for _, sub := range substrs {
			all = all && strings.Contains(line, sub)
		}
		if all {
			n++
		}
	}
	return n
}

// waitUntil polls cond every 10 ms for at most within.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// threeWitnesses starts three witness processes for vkey's log.
func threeWitnesses(t *testing.T, vkey string) ([]*witness.Process, []note.Verifier) {
	t.Helper()
	var ps []*witness.Process
	var vs []note.Verifier
	for _, name := range []string{"w1.test", "w2.test", "w3.test"} {
		p := witness.Start(t, name, vkey)
		v, err := LoadWitnessKey(p.VKey)
		if err != nil {
			t.Fatal(err)
		}
		ps, vs = append(ps, p), append(vs, v)
	}
	return ps, vs
}

// witnessedSize is the size CheckWitnessed establishes, or -1.
func witnessedSize(dir string, v note.Verifier, ws []note.Verifier, quorum int) int64 {
	n, err := CheckWitnessed(dir, v, ws, quorum)
	if err != nil {
		return -1
	}
	return n
}

// TestSubmitterWitnessesEachCheckpoint: a log whose OnCheckpoint
// notifies a Submitter gets each new checkpoint cosigned by all three
// witness processes without anyone calling Cosign, and each outcome is
// logged once.
func TestSubmitterWitnessesEachCheckpoint(t *testing.T) {
	k, vkey := keysWithVKey(t, "tether.test/custodian-1")
	ps, wvs := threeWitnesses(t, vkey)
	var ws []Witness
	for i, p := range ps {
		ws = append(ws, Witness{URL: p.URL, Verifier: wvs[i]})
	}
	var logs syncLog
	dir := filepath.Join(t.TempDir(), "audit")
	sub, err := NewSubmitter(dir, k.v, SubmitOptions{Witnesses: ws, Quorum: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	l, err := Open(dir, Options{Signer: k.s, Verifier: k.v, CheckpointEvery: time.Hour, OnCheckpoint: sub.Notify})
	if err != nil {
		t.Fatal(err)
	}
	for round, size := range []int64{5, 9} {
		for i := l.next; i < size; i++ {
			l.Append(rec(int(i)))
		}
		if _, err := l.Checkpoint(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 20*time.Second, "the checkpoint cosigned by all three", func() bool { return witnessedSize(dir, k.v, wvs, 3) == size })
		waitUntil(t, 5*time.Second, "its outcome logged", func() bool { return logs.count("audit checkpoint witnessed") == round+1 })
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	sub.Close()
	if n := logs.count("size=9", "cosigned=w1.test,w2.test,w3.test"); n != 1 {
		t.Fatalf("the outcome of size 9 logged %d times, want once:\n%s", n, logs.String())
	}
	if n := logs.count("level=WARN"); n != 0 {
		t.Fatalf("warnings with every witness up:\n%s", logs.String())
	}
}

// TestSubmitterRetriesAWitnessDown: with w3 down, the checkpoint reaches
// the quorum of 2 at once; w3 is retried with backoff and its failure is
// logged once, by name, however many retries fail; once it is back, a
// retry (no new checkpoint) has it cosign and its recovery is logged.
func TestSubmitterRetriesAWitnessDown(t *testing.T) {
	k, vkey := keysWithVKey(t, "tether.test/custodian-1")
	ps, wvs := threeWitnesses(t, vkey)
	g := startGate(t, ps[2].URL, false)
	ws := []Witness{{URL: ps[0].URL, Verifier: wvs[0]}, {URL: ps[1].URL, Verifier: wvs[1]}, {URL: g.URL(), Verifier: wvs[2]}}
	var logs syncLog
	dir := writeLog(t, k, 6)
	sub, err := NewSubmitter(dir, k.v, SubmitOptions{Witnesses: ws, Quorum: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		RetryMin: 20 * time.Millisecond, RetryMax: 80 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sub.Notify(6)
	waitUntil(t, 20*time.Second, "quorum 2 reached with w3 down", func() bool { return witnessedSize(dir, k.v, wvs, 2) == 6 })
	waitUntil(t, 20*time.Second, "w3 retried at least 4 times", func() bool { return g.conns.Load() >= 5 })
	if n := logs.count("audit witness failed", "witness=w3.test"); n != 1 {
		t.Fatalf("w3's failure streak logged %d times, want once:\n%s", n, logs.String())
	}
	if witnessedSize(dir, k.v, wvs[2:], 1) != -1 {
		t.Fatal("w3 cosigned while down")
	}
	g.up.Store(true)
	waitUntil(t, 20*time.Second, "w3 cosigning after it came back", func() bool { return witnessedSize(dir, k.v, wvs[2:], 1) == 6 })
	waitUntil(t, 5*time.Second, "w3's recovery logged", func() bool { return logs.count("cosigns again", "witness=w3.test") == 1 })
	if n := logs.count("audit checkpoint witnessed", "size=6"); n != 1 {
		t.Fatalf("the outcome of size 6 logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestSubmitterNeverBlocksTheLog: with two of three witnesses hanging
// (connections accepted, never answered), the log's checkpoints and
// appends go on at their own pace while a round waits; the checkpoint
// does not reach the quorum of 2, which is logged and leaves no cosigned
// checkpoint; Close returns after its CloseTimeout.
func TestSubmitterNeverBlocksTheLog(t *testing.T) {
	k, vkey := keysWithVKey(t, "tether.test/custodian-1")
	ps, wvs := threeWitnesses(t, vkey)
	h2, h3 := startGate(t, ps[1].URL, true), startGate(t, ps[2].URL, true)
	ws := []Witness{{URL: ps[0].URL, Verifier: wvs[0]}, {URL: h2.URL(), Verifier: wvs[1]}, {URL: h3.URL(), Verifier: wvs[2]}}
	var logs syncLog
	dir := filepath.Join(t.TempDir(), "audit")
	sub, err := NewSubmitter(dir, k.v, SubmitOptions{Witnesses: ws, Quorum: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		RequestTimeout: time.Minute, CloseTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(dir, Options{Signer: k.s, Verifier: k.v, CheckpointEvery: time.Hour, OnCheckpoint: sub.Notify})
	if err != nil {
		t.Fatal(err)
	}
	l.Append(rec(0))
	l.Checkpoint(context.Background())
	waitUntil(t, 20*time.Second, "a round waiting on the hung witnesses", func() bool { return h2.conns.Load() >= 1 && h3.conns.Load() >= 1 })
	start := time.Now()
	for i := 1; i < 40; i++ {
		l.Append(rec(i))
		if _, err := l.Checkpoint(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("39 checkpoints took %v while a witness round hung", d)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	sub.Close()
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Close took %v with a CloseTimeout of 500ms", d)
	}
	if _, err := CheckWitnessed(dir, k.v, wvs, 2); !errors.Is(err, ErrWitnessQuorum) {
		t.Fatalf("witnessed check with two witnesses hung: %v, want ErrWitnessQuorum", err)
	}
	if logs.count("quorum not reached") == 0 || logs.count("did not end in time") != 1 {
		t.Fatalf("the missed quorum and the abandoned last round are not logged:\n%s", logs.String())
	}
}

// TestCheckWitnessURL: https anywhere, plain http only to loopback.
func TestCheckWitnessURL(t *testing.T) {
	for u, ok := range map[string]bool{
		"https://w1.example:7380":          true,
		"https://w1.example/witness":       true,
		"http://127.0.0.1:7380":            true,
		"http://[::1]:7380":                true,
		"http://localhost:7380":            true,
		"http://w1.example:7380":           false,
		"http://10.0.0.1:7380":             false,
		"http://127.0.0.1.example.com:80":  false,
		"ftp://127.0.0.1":                  false,
		"127.0.0.1:7380":                   false,
		"https://user:pw@w1.example":       false,
		"https://w1.example/?next=http://": false,
		"":                                 false,
	} {
		if err := CheckWitnessURL(u); (err == nil) != ok || (err != nil && !errors.Is(err, ErrWitnessURL)) {
			t.Errorf("CheckWitnessURL(%q) = %v, want ok %v", u, err, ok)
		}
	}
}

// TestNewSubmitterRefusals: no witness, a quorum above them, a repeated
// key and a plain-http remote URL are refused before anything runs.
func TestNewSubmitterRefusals(t *testing.T) {
	k, _ := keysWithVKey(t, "tether.test/custodian-1")
	v := mustWitnessKey(t, "w1.test")
	for name, c := range map[string]struct {
		o    SubmitOptions
		want error
	}{
		"none":       {SubmitOptions{}, ErrWitnessQuorum},
		"quorum":     {SubmitOptions{Witnesses: []Witness{{URL: "https://a", Verifier: v}}, Quorum: 2}, ErrWitnessQuorum},
		"duplicate":  {SubmitOptions{Witnesses: []Witness{{URL: "https://a", Verifier: v}, {URL: "https://b", Verifier: v}}}, ErrWitnessKey},
		"plain_http": {SubmitOptions{Witnesses: []Witness{{URL: "http://a.example", Verifier: v}}}, ErrWitnessURL},
	} {
		if s, err := NewSubmitter(t.TempDir(), k.v, c.o); !errors.Is(err, c.want) {
			if s != nil {
				s.Close()
			}
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

// mustWitnessKey returns a cosignature/v1 verifier for a fresh key.
func mustWitnessKey(t *testing.T, name string) note.Verifier {
	t.Helper()
	pub, _, _ := ed25519.GenerateKey(nil)
	key := append([]byte{algCosignatureV1}, pub...)
	h := sha256.Sum256(append([]byte(name+"\n"), key...))
	v, err := LoadWitnessKey(fmt.Sprintf("%s+%08x+%s", name, binary.BigEndian.Uint32(h[:]), base64.StdEncoding.EncodeToString(key)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}
