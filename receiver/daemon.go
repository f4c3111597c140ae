package receiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/receiver/caps"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// ShutdownGrace bounds how long Run waits for requests in flight when
// its context ends; then they are cancelled and every child is killed.
const ShutdownGrace = 10 * time.Second

// Run is the daemon as `tether-receiver --config FILE` runs it: it refuses
// to start unless the process is uid 0 with the seven capabilities
// (caps.Check, naming each missing one), drops every other capability
// from every thread (caps.Narrow), then starts serving cfg until ctx ends
// and shuts down. It changes the whole process; in-process users that
// must not do that call Start. Descriptors the process holds without
// close-on-exec reach every command: the caller marks inherited ones
// close-on-exec first (tether-receiver does, before it opens anything).
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := caps.Check(); err != nil {
		return fmt.Errorf("start-up check: %w", err)
	}
	if err := caps.Narrow(); err != nil {
		return fmt.Errorf("drop capabilities: %w", err)
	}
	d, err := Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-d.failed:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownGrace)
	defer cancel()
	return errors.Join(d.Shutdown(sctx), d.Err())
}

// Daemon is a started receiver: the admission refresher, the Handler, the
// wire server and its listeners. Shutdown stops it.
type Daemon struct {
	refresher *signedfile.Refresher
	handler   *Handler
	server    *wireserver.Server
	addrs     []string
	log       *slog.Logger

	serving  sync.WaitGroup
	failOnce sync.Once
	failed   chan struct{}
	mu       sync.Mutex
	err      error
}

// Start builds the daemon from cfg in this process and starts serving. It
// does not check or change the process's capabilities (Run does); the
// caller must Shutdown the Daemon.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Daemon{log: log, failed: make(chan struct{})}
	if err := d.build(ctx, cfg); err != nil {
		d.closeParts()
		return nil, err
	}
	listeners, err := listenAll(ctx, cfg, log)
	if err != nil {
		d.closeParts()
		return nil, err
	}
	for _, l := range listeners {
		d.addrs = append(d.addrs, l.Addr())
		d.serving.Add(1)
		go d.serve(ctx, l)
	}
	log.Info("receiver: serving", "listen", d.addrs, "landlock", cfg.Landlock.Mode, "cgroup", cfg.Cgroup.Mode, "seccomp", cfg.Seccomp.Mode, "spawn", cfg.Spawn)
	return d, nil
}

// build creates the refresher, the handler and the server.
func (d *Daemon) build(ctx context.Context, cfg Config) error {
	pub, err := signing.LoadPublicKey(cfg.Admission.PublicKey)
	if err != nil {
		return fmt.Errorf("%w: admission.public_key: %w", ErrConfig, err)
	}
	l, err := signedfile.NewLoader(signedfile.LoaderConfig{Path: cfg.Admission.File, PublicKey: pub,
		OwnerUID: cfg.Admission.OwnerUID, MaxBytes: cfg.Admission.MaxBytes})
	if err != nil {
		return fmt.Errorf("%w: admission: %w", ErrConfig, err)
	}
	if d.refresher, err = signedfile.NewRefresher(ctx, l, signedfile.RefresherOptions{}); err != nil {
		return err
	}
	mode, _ := cfg.spawnMode()
	if d.handler, err = NewHandler(Options{Grants: d.refresher, Limits: cfg.Limits, Landlock: cfg.Landlock, ChildEnv: cfg.ChildEnv,
		Cgroup: cfg.Cgroup, Seccomp: cfg.Seccomp, SpawnMode: mode, FenceState: cfg.FenceState, Log: d.log}); err != nil {
		return err
	}
	d.server, err = wireserver.NewServer(d.handler, wireserver.ServerConfig{MaxFrame: cfg.MaxFrame, Log: d.log})
	return err
}

// listenAll opens every configured channel, or none.
func listenAll(ctx context.Context, cfg Config, log *slog.Logger) ([]transport.Listener, error) {
	var out []transport.Listener
	for i, lc := range cfg.Listen {
		tr, err := lc.Transport(log)
		var l transport.Listener
		if err == nil {
			l, err = tr.Listen(ctx)
		}
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("listen[%d] (%s): %w", i, lc.Kind, err)
		}
		out = append(out, l)
	}
	return out, nil
}

func (d *Daemon) serve(ctx context.Context, l transport.Listener) {
	defer d.serving.Done()
	err := d.server.Serve(ctx, l)
	if err == nil || errors.Is(err, wireserver.ErrServerClosed) || errors.Is(err, context.Canceled) {
		return
	}
	d.mu.Lock()
	d.err = errors.Join(d.err, fmt.Errorf("serve %s: %w", l.Addr(), err))
	d.mu.Unlock()
	d.failOnce.Do(func() { close(d.failed) })
}

// Addrs names the channels the daemon listens on.
func (d *Daemon) Addrs() []string { return append([]string(nil), d.addrs...) }

// Err returns why a listener failed, if one did.
func (d *Daemon) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// Shutdown kills every child and waits until each is reaped (so a pending
// exec_wait answers at once), stops accepting, lets the other requests in
// flight finish until ctx ends, then closes the refresher. Children never
// outlive the daemon. Safe to call twice.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.handler.Close()
	err := d.server.Shutdown(ctx)
	d.serving.Wait()
	d.closeParts()
	if errors.Is(err, wireserver.ErrServerClosed) {
		return nil
	}
	return err
}

func (d *Daemon) closeParts() {
	if d.server != nil {
		d.server.Close()
	}
	if d.handler != nil {
		d.handler.Close()
	}
	if d.refresher != nil {
		d.refresher.Close()
	}
}
