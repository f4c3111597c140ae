package custodian

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/fixtures/etcdtest"
)

// benchCustodian is one in-process custodian with its receiver link; with
// a fleet store it keeps its keys in etcd, else in its own bbolt file.
type benchCustodian struct {
	c    *Custodian
	recv *Receiver
}

func newBenchCustodian(b *testing.B, rr *realReceiver, fleet *opstore.EtcdStore) *benchCustodian {
	b.Helper()
	skey, _, err := audit.GenerateKey("tether.bench/custodian")
	must(b, err)
	c, err := New(Options{StateDir: filepath.Join(b.TempDir(), "state"), AuditKey: []byte(skey), Fleet: fleet})
	must(b, err)
	bc := &benchCustodian{c: c, recv: NewReceiver(rr.dialer(), Backoff{}, nil)}
	b.Cleanup(func() { bc.recv.Close(); bc.c.Close() })
	return bc
}

// benchFleetStore opens an etcd op store on c under prefix, closed at the
// benchmark's cleanup.
func benchFleetStore(b *testing.B, c *etcdtest.Cluster, prefix, name string) *opstore.EtcdStore {
	b.Helper()
	s, err := opstore.OpenEtcd(context.Background(), opstore.EtcdOptions{Client: c.Client(b), Prefix: prefix, Name: name,
		LeaseTTL: 10 * time.Second})
	must(b, err)
	b.Cleanup(func() { s.Close() })
	return s
}

// benchSession is one bound session: the agent side of its own ACP
// connection to a custodian, and its tuple.
type benchSession struct {
	agent *acp.AgentSideConnection
	tuple admission.Tuple
	sid   acp.SessionId
}

// session binds sid on a new ACP connection to bc (the agent attaches
// during session/new, so a fleet custodian claims it then).
func (bc *benchCustodian) session(b *testing.B, tuple admission.Tuple, sid string) *benchSession {
	b.Helper()
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	agent := &testAgent{sessionID: sid, attachOnNew: true}
	g := &testagent.Gate{R: c2aR, Ready: make(chan struct{})}
	agent.conn = acp.NewAgentSideConnection(agent, a2cW, g)
	close(g.Ready)
	conn := bc.c.Serve(c2aW, a2cR, ConnOptions{})
	b.Cleanup(func() { c2aW.Close(); a2cW.Close(); conn.Close() })
	ctx := context.Background()
	_, err := conn.Initialize(ctx)
	must(b, err)
	_, err = conn.NewSession(ctx, acp.NewSessionRequest{Cwd: tuple.Root, McpServers: []acp.McpServer{}},
		Binding{Tuple: tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: tuple.Owner, Receiver: bc.recv})
	must(b, err)
	if agent.attachErr != nil {
		b.Fatal(agent.attachErr)
	}
	return &benchSession{agent: agent.conn, tuple: tuple, sid: acp.SessionId(sid)}
}

// exec runs /bin/true as run_command does (create, wait, output,
// release), keyed from key.
func (s *benchSession) exec(ctx context.Context, key string) error {
	meta := func(step string) map[string]any {
		return acpmeta.Op{TupleSHA256: s.tuple.SHA256(), OpKey: key + ":" + step, Deadline: time.Now().Add(time.Minute)}.Meta()
	}
	t, err := s.agent.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: s.sid, Command: "/bin/true", Cwd: &s.tuple.Root, Meta: meta("create")})
	if err != nil {
		return err
	}
	if _, err := s.agent.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: s.sid, TerminalId: t.TerminalId, Meta: meta("wait")}); err != nil {
		return err
	}
	if _, err := s.agent.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: s.sid, TerminalId: t.TerminalId, Meta: meta("output")}); err != nil {
		return err
	}
	_, err = s.agent.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: s.sid, TerminalId: t.TerminalId, Meta: meta("release")})
	return err
}

// BenchmarkIntegrationFleetExec: run_command of /bin/true through a real
// receiver by a custodian whose op store is a real 3-member etcd cluster,
// against the same custodian on its bbolt store, interleaved call by call
// (each on its own tuple: a tuple fenced by a token refuses token-less
// requests). Reports each one's p50 and p99 and etcd/bbolt.
func BenchmarkIntegrationFleetExec(b *testing.B) {
	rr := &realReceiver{Receiver: realrecv.StartWith(b, realrecv.Options{Tuples: 2})}
	rr.sock, rr.tuple = rr.Sock, rr.Tuple
	c := etcdtest.Start(b, etcdtest.Options{})
	fleet := benchFleetStore(b, c, fmt.Sprintf("/bench-exec/%d/", time.Now().UnixNano()), "bench-etcd")
	sessions := [2]*benchSession{
		newBenchCustodian(b, rr, nil).session(b, rr.Tuples[0], "sess-bbolt"),
		newBenchCustodian(b, rr, fleet).session(b, rr.Tuples[1], "sess-etcd"),
	}
	ctx := context.Background()
	run := newKey("fx")
	var took [2][]time.Duration
	for i := 0; b.Loop(); i++ {
		for j := range 2 {
			w := (i + j) % 2
			start := time.Now()
			if err := sessions[w].exec(ctx, fmt.Sprintf("%s-%d", run, i)); err != nil {
				b.Fatalf("%s: %v", sessions[w].sid, err)
			}
			took[w] = append(took[w], time.Since(start))
		}
	}
	bb, et := quantile(took[0], 0.5), quantile(took[1], 0.5)
	b.ReportMetric(float64(bb.Microseconds()), "bbolt-p50-µs")
	b.ReportMetric(float64(et.Microseconds()), "etcd-p50-µs")
	b.ReportMetric(float64(quantile(took[0], 0.99).Microseconds()), "bbolt-p99-µs")
	b.ReportMetric(float64(quantile(took[1], 0.99).Microseconds()), "etcd-p99-µs")
	b.ReportMetric(float64(et)/float64(bb), "etcd/bbolt-p50")
}

// BenchmarkIntegrationFleetTakeover: the time from the SIGKILL of the
// custodian process that owns a session to the first op (a run_command)
// answered by a standby process that was waiting for it, against the
// ownership lease TTL (2 s). Each iteration is one takeover of a fresh
// session; p50 and p95 over the iterations (-benchtime 20x for the
// figures in docs/performance.md).
func BenchmarkIntegrationFleetTakeover(b *testing.B) {
	rr := startReceiver(b)
	c := etcdtest.Start(b, etcdtest.Options{})
	fc := newFleetConfig(b, c, rr, rr.tuple, "")
	ctx := context.Background()
	var took []time.Duration
	for i := 0; b.Loop(); i++ {
		fc.Session = fmt.Sprintf("sess-takeover-%d", i)
		owner := startFleet(b, fc, fmt.Sprintf("owner-%d", i))
		owner.bound(b)
		fs := fc
		fs.Standby = true
		standby := startFleet(b, fs, fmt.Sprintf("standby-%d", i))
		standby.waiting(b) // connected to etcd: the kill is not timed against its start
		killed := time.Now()
		owner.kill()
		standby.bound(b)
		if _, err := standby.exec(ctx, fmt.Sprintf("first-%d", i), "true"); err != nil { // the receiver keeps op keys per tuple: one per iteration
			b.Fatalf("the standby's first op: %v", err)
		}
		took = append(took, time.Since(killed))
		standby.stdin.Close()
		<-standby.exited
	}
	ttl := fc.LeaseTTL
	p50, p95 := quantile(took, 0.5), quantile(took, 0.95)
	b.ReportMetric(float64(p50.Milliseconds()), "takeover-p50-ms")
	b.ReportMetric(float64(p95.Milliseconds()), "takeover-p95-ms")
	b.ReportMetric(float64(ttl.Milliseconds()), "lease-ttl-ms")
	b.ReportMetric(float64(p50)/float64(ttl), "p50/ttl")
	b.ReportMetric(float64(p95)/float64(ttl), "p95/ttl")
}

// BenchmarkIntegrationFleetThroughput: 64 sessions, each on its own tuple
// and ACP connection, spread over 2 custodians, all running run_command
// of /bin/true at once through one real receiver; the custodians share
// one 3-member etcd cluster, against the same 64 sessions over 2
// custodians on their own bbolt stores, round by round (one command per
// session a round). Reports each one's commands per second and
// etcd/bbolt.
func BenchmarkIntegrationFleetThroughput(b *testing.B) {
	const sessions = 64
	rr := &realReceiver{Receiver: realrecv.StartWith(b, realrecv.Options{Tuples: 2 * sessions})}
	rr.sock, rr.tuple = rr.Sock, rr.Tuple
	c := etcdtest.Start(b, etcdtest.Options{})
	prefix := fmt.Sprintf("/bench-c64/%d/", time.Now().UnixNano())
	custodians := [2][2]*benchCustodian{
		{newBenchCustodian(b, rr, nil), newBenchCustodian(b, rr, nil)},
		{newBenchCustodian(b, rr, benchFleetStore(b, c, prefix, "bench-a")), newBenchCustodian(b, rr, benchFleetStore(b, c, prefix, "bench-b"))},
	}
	var fleets [2][]*benchSession
	for w := range 2 {
		for i := range sessions {
			tu := rr.Tuples[w*sessions+i]
			fleets[w] = append(fleets[w], custodians[w][i%2].session(b, tu, fmt.Sprintf("sess-%d-%d", w, i)))
		}
	}
	ctx := context.Background()
	run := newKey("tp")
	var busy [2]time.Duration
	for i := 0; b.Loop(); i++ {
		for j := range 2 {
			w := (i + j) % 2
			busy[w] += round(ctx, b, fleets[w], fmt.Sprintf("%s-%d", run, i))
		}
	}
	n := float64(b.N * sessions)
	bb, et := n/busy[0].Seconds(), n/busy[1].Seconds()
	b.ReportMetric(bb, "bbolt-cmds/s")
	b.ReportMetric(et, "etcd-cmds/s")
	b.ReportMetric(et/bb, "etcd/bbolt")
}

// round runs one command in every session at once and returns how long
// the round took.
func round(ctx context.Context, b *testing.B, ss []*benchSession, key string) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(ss))
	for _, s := range ss {
		wg.Go(func() {
			if err := s.exec(ctx, key); err != nil {
				errs <- fmt.Errorf("%s: %w", s.sid, err)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return took
}
