package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/bins"
	"github.com/tetherdev/tether/computer/httpserver"
	"github.com/tetherdev/tether/computer/metrics"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/computer/vm"
)

// daemonConfig is what one daemon needs: `serve` fills it from flags,
// and `demo` embeds the same daemon in its own process.
type daemonConfig struct {
	Dir     string // the service's state and machines
	Socket  string // the API's unix socket, named to each computer's custodian
	BinDir  string // holds tether-receiver
	Service service.Config
	Tokens  string // token file; empty admits no bearer token
	Logger  *slog.Logger
	// MaxUpload caps an import's or a copy in's body (0: the server's
	// default, httpserver.DefaultMaxStreamBytes).
	MaxUpload int64
	// VM, when its Accel is set, offers the VM tier (computer/vm);
	// BinDir must then hold tether-vmguest too.
	VM vm.Config
	// EgressStats reads one computer's counters at the egress proxy; nil
	// when the service gives no egress (no egress series then).
	EgressStats func(id string) (metrics.EgressStats, bool)
}

// daemon is the computer service with its HTTP face and metrics. Close
// ends the service's background work and leaves the computers running,
// for the next daemon to adopt.
type daemon struct {
	svc  *service.Service
	srv  *httpserver.Server
	m    *metrics.Metrics
	dir  string          // the service's Dir
	prov api.Provisioner // the default tier's
	vm   *vm.Provisioner // nil without --vm
}

// openDaemon opens the service in cfg.Dir (adopting what a previous
// daemon left) and builds the server over it, with /metrics mounted for
// admins.
func openDaemon(ctx context.Context, cfg daemonConfig) (*daemon, error) {
	b := bins.Set{Dir: cfg.BinDir}
	if err := b.Require(bins.Receiver); err != nil {
		return nil, fmt.Errorf("receiver binary: %w", err)
	}
	sc := cfg.Service
	sc.Dir, sc.Socket = cfg.Dir, cfg.Socket
	sc.Provisioner = provision.NewProvisioner(provision.Config{Bins: b})
	vp, err := offerVM(&sc, cfg, b)
	if err != nil {
		return nil, err
	}
	svc, err := service.Open(ctx, sc)
	if err != nil {
		return nil, err
	}
	d := &daemon{svc: svc, dir: sc.Dir, prov: sc.Provisioner, vm: vp}
	d.m = metrics.New(d.usage)
	if cfg.EgressStats != nil {
		d.m.WatchEgress(func() map[string]metrics.EgressStats { return egressStats(svc, cfg.EgressStats) })
	}
	var tokens *httpserver.Tokens
	if cfg.Tokens != "" {
		if tokens, err = httpserver.OpenTokens(cfg.Tokens); err != nil {
			svc.Close()
			return nil, err
		}
	}
	backend := &instrumented{Backend: svc, m: d.m}
	d.srv, err = httpserver.New(httpserver.Config{Backend: backend, Tokens: tokens, Logger: cfg.Logger,
		MaxStreamBytes: cfg.MaxUpload})
	if err != nil {
		svc.Close()
		return nil, err
	}
	d.srv.Mount("GET /metrics", d.metricsHandler())
	go d.watch(ctx)
	return d, nil
}

// Close closes the service; the computers keep running.
func (d *daemon) Close() error {
	err := d.svc.Close()
	if d.vm != nil {
		err = errors.Join(err, d.vm.Close()) // its vsock link listener, if any
	}
	return err
}

// endCaller is who the daemon's own ending of its computers acts as.
var endCaller = api.Caller{Owner: prog, Admin: true}

// closeEnding is Close for a daemon whose computers must not outlive it
// (a demo's), on every path: it ends every computer not yet ended
// through the service (Delete: the expiry order, records kept; a
// create under way is waited for, then ended), closes, then destroys
// with its tier's provisioner every machine directory the service still
// holds (computers/ID, pool/NAME): what an ending could not tear down,
// destroyed as the service's Open destroys a computer whose receiver
// died (the QEMU process and cgroups of a VM, the namespaces and
// cgroups of a local one). It returns the computers it ended, and an
// error naming each computer or directory it could not end or destroy
// (a VM's Destroy names what is left: directory, cgroups, QEMU pid).
func (d *daemon) closeEnding(ctx context.Context) ([]string, error) {
	ended, tiers, errs := d.endAll(ctx)
	errs = append(errs, d.Close())
	errs = append(errs, destroyLeft(ctx, d.dir, tiers, d.provFor)...)
	return ended, errors.Join(errs...)
}

// endAll deletes every computer that has not ended, as endCaller. It
// returns those it ended, every computer's tier, and the failures.
func (d *daemon) endAll(ctx context.Context) (ended []string, tiers map[string]string, errs []error) {
	cs, err := d.svc.List(ctx, endCaller)
	if err != nil {
		return nil, nil, []error{fmt.Errorf("list the computers: %w", err)}
	}
	tiers = map[string]string{}
	for _, c := range cs {
		tiers[c.ID] = c.Tier
		if c.State == api.StateDeleted || c.State == api.StateFailed {
			continue
		}
		if err := d.svc.Delete(ctx, endCaller, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("end %s: %w", c.ID, err))
			continue
		}
		ended = append(ended, c.ID)
	}
	return ended, tiers, errs
}

// provFor is the provisioner of tier (the default tier's for "" and
// for a tier this daemon does not offer).
func (d *daemon) provFor(tier string) api.Provisioner {
	if tier == api.TierVM && d.vm != nil {
		return d.vm
	}
	return d.prov
}

// destroyLeft destroys every machine directory left under dir
// (computers/ID with the provisioner of the computer's tier in tiers,
// pool/NAME with the default tier's) and returns an error for each it
// could not destroy, naming it.
func destroyLeft(ctx context.Context, dir string, tiers map[string]string, provFor func(tier string) api.Provisioner) []error {
	var errs []error
	for _, sub := range []string{"computers", "pool"} {
		ents, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("read the machines' directories: %w", err))
		}
		for _, e := range ents {
			tier := ""
			if sub == "computers" {
				tier = tiers[e.Name()]
			}
			md := filepath.Join(dir, sub, e.Name())
			if err := provFor(tier).Destroy(ctx, md); err != nil {
				errs = append(errs, fmt.Errorf("destroy %s: %w", md, err))
			}
		}
	}
	return errs
}

// metricsHandler refreshes the gauges read from the service's counters,
// then serves the registry.
func (d *daemon) metricsHandler() http.Handler {
	h := d.m.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := d.svc.Stats()
		d.m.SetComputers(st.ByState)
		d.m.SetQueueLength(st.Queued)
		for name, n := range st.PoolReady {
			d.m.SetPoolSize(name, n)
		}
		h.ServeHTTP(w, r)
	})
}

// usage reads every live computer's cgroups at scrape time.
func (d *daemon) usage(ctx context.Context) map[string]api.Usage { return d.svc.Usage(ctx) }

// watch counts lease expiries and queue waits from the event stream, as
// an admin sees it, until ctx ends.
func (d *daemon) watch(ctx context.Context) {
	ev, err := d.svc.Events(ctx, api.Caller{Owner: "metrics", Admin: true})
	if err != nil {
		return
	}
	queued := map[string]time.Time{}
	for e := range ev {
		switch {
		case e.To == api.StateQueued:
			queued[e.Computer] = e.At
		case e.From == api.StateQueued:
			if t, ok := queued[e.Computer]; ok {
				d.m.ObserveQueueWait(e.At.Sub(t))
				delete(queued, e.Computer)
			}
		}
		if e.To == api.StateExpiring {
			d.m.LeaseExpired()
		}
	}
}

// serveUnix serves the API on a unix socket at path until ctx ends:
// root is admitted as an admin, members of group (nil: none) as owners.
func (d *daemon) serveUnix(ctx context.Context, path string, group *uint32) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := httpserver.ListenUnix(path, httpserver.PeerPolicy{Group: group}, nil)
	if err != nil {
		return err
	}
	return d.srv.Serve(ctx, l)
}

// serveTLS serves the API on a TCP listener with TLS 1.3 until ctx ends;
// every request needs a bearer token.
func (d *daemon) serveTLS(ctx context.Context, l net.Listener) error { return d.srv.Serve(ctx, l) }

// instrumented times the creates and resumes the API serves.
type instrumented struct {
	api.Backend
	m *metrics.Metrics
}

func (b *instrumented) Create(ctx context.Context, c api.Caller, req api.CreateRequest) (api.Computer, error) {
	start := time.Now()
	comp, err := b.Backend.Create(ctx, c, req)
	if err == nil {
		b.m.ObserveCreate(time.Since(start))
	}
	return comp, err
}

func (b *instrumented) Resume(ctx context.Context, c api.Caller, id string) (api.Computer, error) {
	start := time.Now()
	comp, err := b.Backend.Resume(ctx, c, id)
	if err == nil {
		b.m.ObserveResume(time.Since(start))
	}
	return comp, err
}

// offerVM adds the VM tier's provisioner to sc when cfg.VM.Accel is set
// and returns it (nil without); the daemon's Close closes it.
func offerVM(sc *service.Config, cfg daemonConfig, b bins.Set) (*vm.Provisioner, error) {
	if cfg.VM.Accel == "" {
		return nil, nil
	}
	if err := b.Require(bins.VMGuest); err != nil {
		return nil, fmt.Errorf("the VM tier's guest agent: %w", err)
	}
	vc := cfg.VM
	vc.Bins = b
	if vc.Log == nil && cfg.Logger != nil {
		vc.Log = func(format string, a ...any) { cfg.Logger.Info(fmt.Sprintf(format, a...)) }
	}
	p := vm.NewProvisioner(vc)
	if _, err := p.Transport(); err != nil {
		return nil, err
	}
	sc.Provisioners = map[string]api.Provisioner{api.TierVM: p}
	return p, nil
}

// egressStats reads the proxy's counters of every computer it serves.
func egressStats(svc *service.Service, read func(string) (metrics.EgressStats, bool)) map[string]metrics.EgressStats {
	out := map[string]metrics.EgressStats{}
	for _, id := range svc.EgressAttached() {
		if s, ok := read(id); ok {
			out[id] = s
		}
	}
	return out
}
