package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/computer/service"
)

// The demo's pool waits at most this long for its first machine.
const demoPoolWait = time.Minute

// demoSteps is one `tether-computer demo`: the computer service's life
// cycle, step by step, through its real API.
type demoSteps struct {
	out io.Writer
	cl  *client.Client
	d   *daemon
	eg  *demoEgress
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog+" demo", prog+" demo [--bin DIR]",
		"Shows the computer service at work, through its API: a create served from the warm pool,\n"+
			"its lease and a renew, suspend and resume, a computer whose lease runs out, and egress:\n"+
			"one allowed and one refused fetch from inside a computer, against a small internet the\n"+
			"demo starts in a network namespace of its own. It embeds the service in this process\n"+
			"(state in a temporary directory) and removes everything at the end. Needs root.")
	fs.SetOutput(stderr)
	binDir := fs.String("bin", "", "directory holding tether-receiver (default: next to tether-computer)")
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code
	}
	bd, err := binDirOf(*binDir)
	if err != nil {
		return fail(stderr, "demo", err)
	}
	if err := demo(ctx, bd, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "%s demo: FAILED: %v\n", prog, err)
		return exitFail
	}
	fmt.Fprintf(stdout, "\n%s demo: every step behaved as expected\n", prog)
	return exitOK
}

// demo embeds a daemon in a fresh directory, runs the steps against its
// socket, and removes the computers, the pool and the directory.
func demo(ctx context.Context, binDir string, stdout, stderr io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: the service makes users, namespaces and cgroups")
	}
	dir, err := os.MkdirTemp("", "tether-computer-demo-")
	if err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		os.RemoveAll(dir)
		return err
	}
	fmt.Fprintln(stdout, "tether-computer demo: the computer service, embedded in this process (no daemon needed)")
	eg, err := startDemoEgress(ctx, dir)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	err, left := demoIn(ctx, dir, binDir, eg, stdout, stderr)
	eg.Close()
	return errors.Join(err, removeDemoDir(dir, left, "demo", stderr))
}

// demoIn runs the steps against a daemon in dir whose computers, and
// warm pool, end with it (endDemoDaemon). It returns what failed, and
// apart what the daemon could not end (also in err).
func demoIn(ctx context.Context, dir, binDir string, eg *demoEgress, stdout, stderr io.Writer) (err, left error) {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	limits := api.Limits{MemoryBytes: 256 << 20, Pids: 128, DiskBytes: 128 << 20}
	sc := service.Config{DefaultLimits: limits, MaxComputers: 4, IdleTimeout: service.DefaultIdleTimeout,
		Pools:  []service.Profile{{Name: "default", Limits: limits, Size: 1}},
		Egress: eg.proxy, EgressPresets: []string{demoPreset},
		Logf: func(f string, a ...any) { logger.Warn(fmt.Sprintf(f, a...)) }}
	cfg := daemonConfig{Dir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "api.sock"), BinDir: binDir, Service: sc, Logger: logger}
	// The steps end with ctx (Ctrl-C); the daemon's ending does not.
	err = withDaemonEnd(context.WithoutCancel(ctx), cfg, filepath.Join(dir, "api.sock"), func(cl *client.Client, d *daemon) error {
		return (&demoSteps{out: stdout, cl: cl, d: d, eg: eg}).run(ctx)
	}, func(ctx context.Context, d *daemon) error {
		left = endDemoDaemon(ctx, d, stdout)
		return left
	})
	return err, left
}

// endDemoDaemon closes a demo's daemon ending every computer it still
// has (the demo's own delete failed, or never came: a step that failed,
// a create interrupted) and destroying what an ending left and its warm
// pool (daemon.closeEnding), and prints each computer it ended to out.
func endDemoDaemon(ctx context.Context, d *daemon, out io.Writer) error {
	ended, err := d.closeEnding(ctx)
	for _, id := range ended {
		fmt.Fprintf(out, "ended %s as the daemon closed (the demo's delete had not)\n", id)
	}
	if err != nil {
		return fmt.Errorf("ending the daemon's computers: %w", err)
	}
	return nil
}

// removeDemoDir removes the directory of demo (the command's name),
// unless its daemon left something it could not end (left): the
// directory then stays, since its machines' state may be all that
// names what still runs, and the demo says so.
func removeDemoDir(dir string, left error, demo string, stderr io.Writer) error {
	if left != nil {
		fmt.Fprintf(stderr, "%s %s: could not remove everything: %v\n"+
			"kept %s: what is named above is still there; remove it, then the directory\n", prog, demo, left, dir)
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(stderr, "%s %s: could not remove %s: %v\n", prog, demo, dir, err)
		return fmt.Errorf("remove the demo's directory: %w", err)
	}
	return nil
}

// withDaemon opens a daemon on cfg, serves its API on sock, calls f with
// a client of it, and closes the daemon (its computers keep running).
func withDaemon(ctx context.Context, cfg daemonConfig, sock string, f func(*client.Client, *daemon) error) error {
	return withDaemonEnd(ctx, cfg, sock, f, func(_ context.Context, d *daemon) error {
		d.Close()
		return nil
	})
}

// withDaemonEnd is withDaemon that ends the daemon with end, once its
// API has stopped serving (end must close it); end's error is joined to
// f's.
func withDaemonEnd(ctx context.Context, cfg daemonConfig, sock string, f func(*client.Client, *daemon) error,
	end func(context.Context, *daemon) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d, err := openDaemon(ctx, cfg)
	if err != nil {
		return err
	}
	served, stopped := make(chan error, 1), make(chan struct{})
	go func() { served <- d.serveUnix(ctx, sock, nil); close(stopped) }()
	cl := client.Unix(sock)
	if err = waitHealthy(ctx, cl, served); err == nil {
		err = f(cl, d)
	}
	cancel()
	<-stopped
	return errors.Join(err, end(context.WithoutCancel(ctx), d))
}

// waitHealthy waits until the socket answers /healthz.
func waitHealthy(ctx context.Context, cl *client.Client, served <-chan error) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for cl.Health(ctx) != nil {
		select {
		case err := <-served:
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

func (s *demoSteps) run(ctx context.Context) error {
	steps := []struct {
		title string
		fn    func(context.Context) error
	}{
		{"create a computer from the warm pool", s.fromPool},
		{"a lease that ends it, unless renewed", s.lease},
		{"suspend and resume", s.suspendResume},
		{"a lease that runs out", s.expiry},
		{"egress: one allowed fetch, one refused, from inside a computer", s.egress},
	}
	for i, st := range steps {
		fmt.Fprintf(s.out, "\n[%d/%d] %s\n", i+1, len(steps), st.title)
		if err := st.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", st.title, err)
		}
	}
	return nil
}

func (s *demoSteps) say(format string, a ...any) { fmt.Fprintf(s.out, "    "+format+"\n", a...) }

// fromPool waits until the pool holds a machine, then creates.
func (s *demoSteps) fromPool(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, demoPoolWait)
	defer cancel()
	if err := s.waitPool(wctx); err != nil {
		return err
	}
	start := time.Now()
	c, err := s.cl.Create(ctx, api.CreateRequest{LeaseTTLSeconds: 300})
	if err != nil {
		return err
	}
	if !c.FromPool {
		return fmt.Errorf("computer %s was made cold, not claimed from the pool", c.ID)
	}
	s.say("%s is %s in %v, claimed from the pool (uid, disk, namespaces and receiver were ready; the grant was published for its tuple at claim)",
		c.ID, c.State, time.Since(start).Round(time.Millisecond))
	s.say("its tuple: owner %s, sandbox %s, root %s", c.Tuple.Owner, c.Tuple.Sandbox, c.Tuple.Root)
	s.say("a custodian reaches it with %s (tether-custodian run --computer-socket does all of this for a run)", c.CustodianConfig)
	return nil
}

// waitPool waits until the pool holds a ready machine: the socket
// answers before the pool's first machine is made.
func (s *demoSteps) waitPool(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for s.d.svc.Stats().PoolReady["default"] == 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the pool never filled: %w", ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// lease renews the demo's computer and shows the new end.
func (s *demoSteps) lease(ctx context.Context) error {
	c, err := s.only(ctx)
	if err != nil {
		return err
	}
	s.say("lease ends %s", c.LeaseExpiresAt.Format(time.RFC3339))
	r, err := s.cl.Renew(ctx, c.ID, 10*time.Minute)
	if err != nil {
		return err
	}
	if !r.LeaseExpiresAt.After(c.LeaseExpiresAt) {
		return fmt.Errorf("renew left the lease at %s", r.LeaseExpiresAt)
	}
	s.say("renewed: now ends %s (at the end: grant withdrawn first, then commands killed, then teardown)", r.LeaseExpiresAt.Format(time.RFC3339))
	return nil
}

func (s *demoSteps) suspendResume(ctx context.Context) error {
	c, err := s.only(ctx)
	if err != nil {
		return err
	}
	sc, err := s.cl.Suspend(ctx, c.ID)
	if err != nil {
		return err
	}
	s.say("suspended: %s (its commands frozen by the cgroup freezer, memory kept, no CPU; the receiver still answers)", sc.State)
	start := time.Now()
	rc, err := s.cl.Resume(ctx, c.ID)
	if err != nil {
		return err
	}
	if rc.State != api.StateRunning {
		return fmt.Errorf("resume left it %s", rc.State)
	}
	s.say("resumed in %v: %s", time.Since(start).Round(time.Microsecond), rc.State)
	return s.cl.Delete(ctx, c.ID)
}

// expiry makes a computer with a 2 s lease and waits for its end on the
// event stream.
func (s *demoSteps) expiry(ctx context.Context) error {
	ev, err := s.cl.Events(ctx)
	if err != nil {
		return err
	}
	defer ev.Close()
	c, err := s.cl.Create(ctx, api.CreateRequest{LeaseTTLSeconds: 2})
	if err != nil {
		return err
	}
	s.say("%s made with a 2 s lease, ending %s", c.ID, c.LeaseExpiresAt.Format(time.RFC3339Nano))
	for {
		e, err := ev.Next()
		if err != nil {
			return fmt.Errorf("event stream: %w", err)
		}
		if e.Computer != c.ID {
			continue
		}
		from := e.From
		if from == "" {
			from = "(new)"
		}
		s.say("event: %s -> %s (%s)", from, e.To, e.Reason)
		if e.To == api.StateDeleted {
			s.say("gone %v after its lease ended", e.At.Sub(c.LeaseExpiresAt).Round(time.Millisecond))
			return nil
		}
	}
}

// only returns the one live computer the demo holds.
func (s *demoSteps) only(ctx context.Context) (api.Computer, error) {
	list, err := s.cl.List(ctx)
	if err != nil {
		return api.Computer{}, err
	}
	for _, c := range list {
		if c.State == api.StateRunning {
			return c, nil
		}
	}
	return api.Computer{}, errors.New("no running computer")
}
