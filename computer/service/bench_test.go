package service

// The computer service's benchmarks (issue 30, docs/performance.md
// "Computer service"): each times the service against a baseline made in
// the same run, interleaved round by round, over the real namespaced
// provisioner. The first command is /bin/true through the receiver's
// exec (exec_start + exec_wait), over a connection the custodian's own
// configuration (api.Computer.CustodianConfig) dials.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
)

// benchLimits is every benchmark computer's profile: a small ext4 disk,
// the provisioner's default pids and memory.
var benchLimits = api.Limits{DiskBytes: 64 << 20}

// benchBins builds tether-receiver once for a benchmark.
func benchBins(b *testing.B) bins.Set {
	b.Helper()
	testenv.Require(b, "root", "cgroup-limits", "loop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	set, err := bins.Build(ctx, bins.Receiver)
	if err != nil {
		b.Fatal(err)
	}
	return set
}

// benchDir is a fresh directory whose parents a computer's uid can
// traverse (the provisioner requires it); removed at cleanup.
func benchDir(b *testing.B) string {
	b.Helper()
	d, err := os.MkdirTemp("", "tether-svcbench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o711); err != nil {
		b.Fatal(err)
	}
	return d
}

// openBench opens a service over the real provisioner in a new
// directory beneath base. At cleanup (after the benchmark's own deletes)
// it waits for the pools to be full (a prepare cut short by Close costs
// the receiver's stop timeout), closes the service, opens it again
// without pools, which destroys the pool machines Close left, and checks
// that no machine directory is left.
func openBench(b *testing.B, base, name string, set bins.Set, cfg Config) *Service {
	b.Helper()
	cfg.Dir = filepath.Join(base, name)
	cfg.Provisioner = provision.NewProvisioner(provision.Config{Bins: set})
	cfg.Logf = b.Logf
	s, err := Open(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		deleteAll(b, s)
		for _, p := range cfg.Pools {
			awaitPool(b, s, p.Name, p.Size)
		}
		s.Close()
		last, err := Open(context.Background(), Config{Dir: cfg.Dir, Provisioner: cfg.Provisioner, Logf: b.Logf})
		if err != nil {
			b.Errorf("open again to destroy the pool: %v", err)
			return
		}
		last.Close()
		for _, sub := range []string{"computers", "pool"} {
			if ents, err := os.ReadDir(filepath.Join(cfg.Dir, sub)); err != nil || len(ents) != 0 {
				b.Errorf("%s/%s after the last close: %d entries, %v", name, sub, len(ents), err)
			}
		}
	})
	return s
}

// deleteAll deletes every computer s still has (a benchmark that failed
// half-way leaves some).
func deleteAll(b *testing.B, s *Service) {
	admin := api.Caller{Owner: "bench", Admin: true}
	cs, err := s.List(context.Background(), admin)
	if err != nil {
		b.Errorf("list: %v", err)
		return
	}
	for _, c := range cs {
		if c.State != api.StateDeleted && c.State != api.StateFailed {
			if err := s.Delete(context.Background(), admin, c.ID); err != nil {
				b.Errorf("delete %s at cleanup: %v", c.ID, err)
			}
		}
	}
}

// awaitPool waits (at most 5 minutes) until the pool name has n ready.
func awaitPool(b *testing.B, s *Service, name string, n int) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for s.PoolReady()[name] < n {
		if time.Now().After(deadline) {
			b.Fatalf("pool %s has %d ready, want %d", name, s.PoolReady()[name], n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// receiverConn is a connection to a computer's receiver dialed as the
// custodian dials it: from the configuration file at path.
type receiverConn struct {
	conn  custodian.ReceiverConn
	tuple string
}

func dialCustodian(ctx context.Context, path string) (*receiverConn, error) {
	cfg, err := custodian.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	dial, err := custodian.ReceiverDialer(cfg.Receiver)
	if err != nil {
		return nil, err
	}
	conn, err := dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial the receiver: %w", err)
	}
	return &receiverConn{conn: conn, tuple: cfg.Tuple.SHA256()}, nil
}

func (r *receiverConn) call(ctx context.Context, op wire.Op, args, res any) error {
	return r.conn.CallFenced(ctx, op, r.tuple, "bench-"+newID(""), 0, time.Now().Add(time.Minute), args, res)
}

// run runs /bin/true and returns once it exited (exit 0 or an error);
// its terminal is left for release.
func (r *receiverConn) run(ctx context.Context) (string, error) {
	var st wire.ExecStartResult
	if err := r.call(ctx, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}}, &st); err != nil {
		return "", fmt.Errorf("exec_start: %w", err)
	}
	var w wire.ExecWaitResult
	if err := r.call(ctx, wire.OpExecWait, wire.TerminalArgs{TerminalID: st.TerminalID}, &w); err != nil {
		return "", fmt.Errorf("exec_wait: %w", err)
	}
	if w.Exit.ExitCode == nil || *w.Exit.ExitCode != 0 {
		return "", fmt.Errorf("/bin/true ended %+v", w.Exit)
	}
	return st.TerminalID, nil
}

func (r *receiverConn) release(ctx context.Context, id string) error {
	var e wire.Empty
	return r.call(ctx, wire.OpExecRelease, wire.TerminalArgs{TerminalID: id}, &e)
}

// firstCommand dials the computer whose custodian configuration is at
// path and runs /bin/true; the caller releases and closes.
func firstCommand(ctx context.Context, path string) (*receiverConn, string, error) {
	rc, err := dialCustodian(ctx, path)
	if err != nil {
		return nil, "", err
	}
	id, err := rc.run(ctx)
	if err != nil {
		rc.conn.Close()
		return nil, "", err
	}
	return rc, id, nil
}

// endCommand releases the first command's terminal and closes the
// connection.
func endCommand(rc *receiverConn, id string) error {
	defer rc.conn.Close()
	if err := rc.release(context.Background(), id); err != nil {
		return fmt.Errorf("exec_release: %w", err)
	}
	return nil
}

// timeCreate times a service create and its first command, then deletes
// the computer (untimed).
func timeCreate(b *testing.B, s *Service, wantPool bool) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	c, err := s.Create(ctx, alice, api.CreateRequest{Limits: benchLimits})
	if err != nil {
		b.Fatalf("create: %v", err)
	}
	rc, id, err := firstCommand(ctx, c.CustodianConfig)
	took := time.Since(start)
	if err != nil {
		b.Fatalf("first command on %s: %v", c.ID, err)
	}
	if c.FromPool != wantPool {
		b.Fatalf("create: from the pool %v, want %v", c.FromPool, wantPool)
	}
	if err := endCommand(rc, id); err != nil {
		b.Fatal(err) // the cleanup deletes the computer
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		b.Fatalf("delete: %v", err)
	}
	return took
}

// timeUp times today's `tether-demo up` path (provision.New of a
// namespaced computer with its grant) and the same first command, then
// closes the computer (untimed) and checks nothing of it is left.
func timeUp(b *testing.B, set bins.Set, dir string) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	l, err := provision.New(ctx, provision.Options{Dir: dir, Bins: set, Detach: true,
		Limits: admission.Limits{MaxDiskBytes: benchLimits.DiskBytes}})
	if err != nil {
		b.Fatalf("provision.New: %v", err)
	}
	rc, id, err := firstCommand(ctx, l.CustodianConfigPath())
	took := time.Since(start)
	if err == nil {
		err = endCommand(rc, id)
	}
	st := l.State()
	if cerr := l.Close(ctx); cerr != nil {
		b.Fatalf("close: %v (first command: %v)", cerr, err)
	}
	if err != nil {
		b.Fatalf("first command: %v", err)
	}
	if err := provision.NothingLeft(st); err != nil {
		b.Fatal(err)
	}
	return took
}

// BenchmarkCreateFirstCommand times create → the first command's exit
// three ways, one each per round in rotating order: "warm" claims a
// pool machine of a service whose pool holds one (its capacity is one
// computer, so the pool refills only after the delete, never during a
// timed call; each call waits untimed for the refill), "cold" prepares a
// machine on a service without a pool, and "up" is today's
// `tether-demo up` path, provision.New with its grant. Each ends with
// the first command's exit: a new connection from the custodian's
// configuration, exec_start and exec_wait of /bin/true. It reports each
// p50 and p99 and the ratios of the p50s to up's.
func BenchmarkCreateFirstCommand(b *testing.B) {
	set := benchBins(b)
	base := benchDir(b)
	warm := openBench(b, base, "warm", set, Config{MaxComputers: 1,
		Pools: []Profile{{Name: "bench", Limits: benchLimits, Size: 1}}})
	cold := openBench(b, base, "cold", set, Config{})
	up := 0
	calls := []func() time.Duration{
		func() time.Duration { awaitPool(b, warm, "bench", 1); return timeCreate(b, warm, true) },
		func() time.Duration { awaitPool(b, warm, "bench", 1); return timeCreate(b, cold, false) },
		func() time.Duration {
			awaitPool(b, warm, "bench", 1)
			up++
			return timeUp(b, set, filepath.Join(base, fmt.Sprintf("up-%d", up)))
		},
	}
	names := []string{"warm", "cold", "up"}
	lat := interleave(b, calls)
	reportLatencies(b, names, lat, "up")
}

// interleave runs each call once per round, in rotating order, and
// returns each one's durations.
func interleave(b *testing.B, calls []func() time.Duration) [][]time.Duration {
	lat := make([][]time.Duration, len(calls))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range calls {
			k := (i + j) % len(calls)
			lat[k] = append(lat[k], calls[k]())
		}
	}
	b.StopTimer()
	return lat
}

// reportLatencies reports each p50 and p99 in milliseconds and each
// p50's ratio to base's.
func reportLatencies(b *testing.B, names []string, lat [][]time.Duration, base string) {
	var basis time.Duration
	for k, n := range names {
		if n == base {
			basis = pctl(lat[k], 50)
		}
	}
	for k, n := range names {
		b.ReportMetric(ms(pctl(lat[k], 50)), n+"-p50-ms")
		b.ReportMetric(ms(pctl(lat[k], 99)), n+"-p99-ms")
		if n != base {
			b.ReportMetric(float64(pctl(lat[k], 50))/float64(basis), n+"/"+base+"-p50")
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pctl is the p-th percentile (nearest rank) of ds.
func pctl(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

// BenchmarkResumeFirstCommand times resume → the first command's exit on
// a computer suspended untimed before each round ("resume": Resume, then
// exec_start and exec_wait of /bin/true over the connection the
// custodian kept while it was suspended), against the same command on
// the same computer running ("running"), alternating; it reports both
// p50s and their ratio.
func BenchmarkResumeFirstCommand(b *testing.B) {
	set := benchBins(b)
	s := openBench(b, benchDir(b), "svc", set, Config{})
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{Limits: benchLimits})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Delete(context.Background(), alice, c.ID) })
	rc, err := dialCustodian(ctx, c.CustodianConfig)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rc.conn.Close() })
	runOnce := func() time.Duration {
		start := time.Now()
		id, err := rc.run(ctx)
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if err := rc.release(ctx, id); err != nil {
			b.Fatal(err)
		}
		return took
	}
	runOnce() // warm the connection
	calls := []func() time.Duration{
		func() time.Duration {
			if got, err := s.Suspend(ctx, alice, c.ID); err != nil || got.State != api.StateSuspended {
				b.Fatalf("suspend: %v (state %q)", err, got.State)
			}
			start := time.Now()
			if got, err := s.Resume(ctx, alice, c.ID); err != nil || got.State != api.StateRunning {
				b.Fatalf("resume: %v (state %q)", err, got.State)
			}
			return time.Since(start) + runOnce()
		},
		runOnce,
	}
	reportLatencies(b, []string{"resume", "running"}, interleave(b, calls), "running")
}

// poolSize is BenchmarkPoolCreates' pool: 64 as the issue asks with
// TETHER_BENCH_FULL=1 (make bench), 4 otherwise (make test's one round).
func poolSize() int {
	if os.Getenv("TETHER_BENCH_FULL") == "1" {
		return 64
	}
	return 4
}

// BenchmarkPoolCreates measures creates per second with a warm pool: all
// of a full pool's machines claimed by as many creates at once ("warm";
// the service's capacity is the pool's size, so no refill runs while
// they are timed), against as many creates at once on a service without
// a pool ("cold"), alternating; every computer is deleted untimed after
// each burst. It reports both rates and their ratio.
func BenchmarkPoolCreates(b *testing.B) {
	set := benchBins(b)
	base := benchDir(b)
	n := poolSize()
	warm := openBench(b, base, "warm", set, Config{MaxComputers: n,
		Pools: []Profile{{Name: "bench", Limits: benchLimits, Size: n}}})
	cold := openBench(b, base, "cold", set, Config{})
	var warmT, coldT []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		awaitPool(b, warm, "bench", n)
		b.StartTimer()
		order := []*Service{warm, cold}
		if i%2 == 1 {
			order = []*Service{cold, warm}
		}
		for _, s := range order {
			took := burst(b, s, n, s == warm)
			if s == warm {
				warmT = append(warmT, took)
			} else {
				coldT = append(coldT, took)
			}
		}
	}
	b.StopTimer()
	rate := func(ds []time.Duration) float64 { return float64(n) / pctl(ds, 50).Seconds() }
	b.ReportMetric(float64(n), "pool")
	b.ReportMetric(rate(warmT), "warm-creates/s")
	b.ReportMetric(rate(coldT), "cold-creates/s")
	b.ReportMetric(rate(warmT)/rate(coldT), "warm/cold-rate")
}

// burst makes n computers on s at once and returns how long until the
// last create returned; then it deletes them all (untimed).
func burst(b *testing.B, s *Service, n int, wantPool bool) time.Duration {
	b.Helper()
	ctx := context.Background()
	cs := make([]api.Computer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() { cs[i], errs[i] = s.Create(ctx, alice, api.CreateRequest{Limits: benchLimits}) })
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	defer b.StartTimer()
	for i, c := range cs {
		if errs[i] != nil {
			b.Fatalf("create %d of %d: %v", i+1, n, errs[i])
		}
		if c.FromPool != wantPool {
			b.Fatalf("create %d of %d: from the pool %v, want %v", i+1, n, c.FromPool, wantPool)
		}
	}
	for i, c := range cs {
		wg.Go(func() { errs[i] = s.Delete(ctx, alice, c.ID) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatalf("delete: %v", err)
		}
	}
	return took
}
