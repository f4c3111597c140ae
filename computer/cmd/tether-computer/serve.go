package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/httpserver"
	"github.com/tetherdev/tether/computer/lifecycle"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/computer/vm"
)

// DefaultDir is where the daemon keeps its state and its computers.
const DefaultDir = "/var/lib/tether-computer"

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog+" serve", prog+" serve [flags]",
		"Runs the computer service: one daemon per host, as root. It keeps its state in --dir\n"+
			"(bbolt, crash-safe), adopts the computers a previous daemon left running, tears down\n"+
			"those whose receiver died, and serves the API on --socket (root and --group's members)\n"+
			"and, with --listen, on TLS 1.3 with bearer tokens from --tokens. Ctrl-C or SIGTERM\n"+
			"stops the daemon; its computers keep running for the next one to adopt.")
	fs.SetOutput(stderr)
	dir := fs.String("dir", DefaultDir, "state directory: the store, the transition log and the computers")
	socket := fs.String("socket", defaultSocket(), "unix socket of the API ($"+envSocket+" changes the default)")
	group := fs.String("group", "", "group (name or gid) whose members may use the socket as owners (default: root only)")
	listen := fs.String("listen", "", "also serve on this TCP address with TLS 1.3 (needs --tls-cert, --tls-key, --tokens)")
	certFile := fs.String("tls-cert", "", "PEM certificate of --listen")
	keyFile := fs.String("tls-key", "", "PEM key of --listen")
	tokens := fs.String("tokens", "", "token file (tether-computer token add); each token names its owner")
	maxUpload := fs.Int64("max-upload", httpserver.DefaultMaxStreamBytes, "largest import or copy-in body, in bytes (streamed, spooled in --dir/spool for an import)")
	binDir := fs.String("bin", "", "directory holding tether-receiver (default: next to tether-computer)")
	vmAccel := fs.String("vm", "", "offer the VM tier with this accelerator: auto, kvm or tcg (default: not offered; --bin must hold tether-vmguest)")
	vmKernel := fs.String("vm-kernel", "", "the VM tier's unpacked guest kernel (default: the CI's vmsuite kernel)")
	vmTransport := fs.String("vm-transport", vm.TransportModeSerial, "the VM tier's link to each guest's receiver: serial (a virtio-serial port), "+
		"vsock (fails at start unless "+vm.VhostVsockDevice+" opens) or auto (vsock where it opens, else serial)")
	vmState := fs.String("vm-state", "", "where the VM tier keeps its saved guest states, root's, 0755; each VM computer then starts from one (default: none, every VM computer boots cold)")
	egressConf := fs.String("egress-config", "", "JSON file of the host's egress proxy (presets, dns, limits, log); "+
		"without it computers have loopback only")
	sc := serviceFlags(fs)
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() != 0 {
		return cli.UsageError(stderr, prog+" serve", "unexpected argument %q", fs.Arg(0))
	}
	gid, err := lookupGroup(*group)
	if err != nil {
		return cli.UsageError(stderr, prog+" serve", "--group: %v", err)
	}
	if err := socketUnserved(*socket); err != nil {
		return fail(stderr, "serve", err)
	}
	if *listen != "" && (*certFile == "" || *keyFile == "" || *tokens == "") {
		return cli.UsageError(stderr, prog+" serve", "--listen needs --tls-cert, --tls-key and --tokens")
	}
	if *vmAccel == "" && *vmTransport != vm.TransportModeSerial {
		return cli.UsageError(stderr, prog+" serve", "--vm-transport needs --vm")
	}
	if *vmAccel != "" {
		tr, err := vm.ChooseTransport(*vmTransport, *vmState)
		if err != nil {
			return fail(stderr, "serve", fmt.Errorf("--vm-transport: %w", err))
		}
		fmt.Fprintf(stderr, "%s serve: VM transport %s\n", prog, tr)
	}
	bd, err := binDirOf(*binDir)
	if err != nil {
		return fail(stderr, "serve", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := daemonConfig{Dir: *dir, Socket: *socket, BinDir: bd, Service: sc.config(), Tokens: *tokens, Logger: logger,
		MaxUpload: *maxUpload, VM: vm.Config{Accel: *vmAccel, Transport: *vmTransport, KernelDir: *vmKernel, StateDir: *vmState}}
	cfg.Service.Logf = func(format string, a ...any) { logger.Warn(fmt.Sprintf(format, a...)) }
	if step := os.Getenv(TestPauseEnv); step != "" {
		cfg.Service.StepHook = pauseAt(step, stderr)
	}
	if *egressConf != "" {
		proxy, ec, err := openProxy(*egressConf, *dir)
		if err != nil {
			return fail(stderr, "serve", err)
		}
		defer proxy.Close() // after the daemon's Close (deferred later, run first)
		cfg.Service.Egress, cfg.Service.EgressPresets = proxy, ec.presetNames()
		cfg.EgressStats = proxyStats(proxy)
		fmt.Fprintf(stderr, "%s serve: egress proxy on, %d presets, log %s\n", prog, len(ec.Presets), ec.Log)
	}
	d, err := openDaemon(ctx, cfg)
	if err != nil {
		return fail(stderr, "serve", err)
	}
	defer d.Close()
	errs := make(chan error, 2)
	if *listen != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return fail(stderr, "serve", fmt.Errorf("--tls-cert/--tls-key: %w", err))
		}
		l, err := httpserver.ListenTLS(*listen, cert)
		if err != nil {
			return fail(stderr, "serve", err)
		}
		go func() { errs <- d.serveTLS(ctx, l) }()
	}
	go func() { errs <- d.serveUnix(ctx, *socket, gid) }()
	fmt.Fprintf(stderr, "%s serve: listening on %s (state in %s)\n", prog, *socket, *dir)
	if err := <-errs; err != nil && ctx.Err() == nil {
		return fail(stderr, "serve", err)
	}
	return exitOK
}

// ErrSocketServed is returned by serve when another process already
// answers on its socket: a second daemon would take the socket from the
// first, whose computers the API would then no longer reach.
var ErrSocketServed = errors.New("another process serves this socket")

// socketUnserved checks, before the daemon opens anything, that no
// process answers on the unix socket path: a connect that succeeds is
// ErrSocketServed. A missing path or a stale socket file (nothing
// listens) is fine; serveUnix replaces the stale file.
func socketUnserved(path string) error {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil
	}
	c.Close()
	return fmt.Errorf("socket %s: %w (a tether-computer serve already runs there?): stop it, or give this one "+
		"another --socket; nothing was started", path, ErrSocketServed)
}

// TestPauseEnv names a service step (service.Step*) at which `serve`
// blocks for good, after saying so on stderr, so that a fault test can
// SIGKILL the daemon exactly there. It is a test hook: unset, nothing
// changes.
const TestPauseEnv = "TETHER_COMPUTER_TEST_PAUSE"

// pauseAt is a service.Config.StepHook that blocks the goroutine that
// reaches step forever, after writing "test pause at STEP" to w.
func pauseAt(step string, w io.Writer) func(string) {
	return func(s string) {
		if s != step {
			return
		}
		fmt.Fprintf(w, "%s serve: test pause at %s\n", prog, s)
		select {}
	}
}

// svcFlags are the service's capacity and lease flags.
type svcFlags struct {
	maxComputers, ownerQuota, pool *int
	maxMemory                      *int64
	maxTTL, ttl, idle              *time.Duration
	memory, pids, disk             *int64
}

func serviceFlags(fs interface {
	Int(string, int, string) *int
	Int64(string, int64, string) *int64
	Duration(string, time.Duration, string) *time.Duration
}) *svcFlags {
	return &svcFlags{
		maxComputers: fs.Int("max-computers", 64, "computers at once on this host, warm pool included"),
		maxMemory:    fs.Int64("max-memory", 0, "committed memory of all computers, in bytes (0: no cap)"),
		ownerQuota:   fs.Int("owner-quota", 16, "computers one owner may hold, queued included"),
		pool:         fs.Int("pool", 2, "computers with the default limits kept ready in the warm pool"),
		maxTTL:       fs.Duration("max-ttl", service.DefaultMaxLeaseTTL, "longest lease a create or renew may ask for"),
		ttl:          fs.Duration("ttl", service.DefaultLeaseTTL, "lease of a create that asks for none"),
		idle:         fs.Duration("idle", service.DefaultIdleTimeout, "idle timeout of a create that asks for none"),
		memory:       fs.Int64("memory", 1<<30, "default memory limit of a computer, bytes"),
		pids:         fs.Int64("pids", 256, "default process limit of a computer"),
		disk:         fs.Int64("disk", 1<<30, "default disk size of a computer, bytes"),
	}
}

// config is the service.Config the flags say (Dir and Provisioner are
// the daemon's).
func (f *svcFlags) config() service.Config {
	def := api.Limits{MemoryBytes: *f.memory, Pids: *f.pids, DiskBytes: *f.disk}
	c := service.Config{DefaultLeaseTTL: *f.ttl, MaxLeaseTTL: *f.maxTTL, IdleTimeout: *f.idle,
		DefaultLimits: def, MaxComputers: *f.maxComputers, MaxMemoryBytes: *f.maxMemory, OwnerQuota: *f.ownerQuota}
	if *f.pool > 0 {
		c.Pools = []service.Profile{{Name: "default", Limits: def, Size: *f.pool}}
	}
	return c
}

// lookupGroup resolves a group name or gid; empty is nil (root only).
func lookupGroup(name string) (*uint32, error) {
	if name == "" {
		return nil, nil
	}
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		g := uint32(n)
		return &g, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return nil, err
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("group %s has gid %q", name, g.Gid)
	}
	v := uint32(n)
	return &v, nil
}

// binDirOf is dir, or the directory of this executable.
func binDirOf(dir string) (string, error) {
	if dir != "" {
		return filepath.Abs(dir)
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("locate tether-computer: %w", err)
	}
	return filepath.Dir(exe), nil
}

func runVerify(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog+" verify", prog+" verify [--dir DIR]",
		"Checks the daemon's transition log: every record's hash, the chain, and that each\n"+
			"transition is one the lifecycle allows. Names the first broken record; exits 1 then.")
	fs.SetOutput(stderr)
	dir := fs.String("dir", DefaultDir, "the daemon's state directory")
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() != 0 {
		return cli.UsageError(stderr, prog+" verify", "unexpected argument %q", fs.Arg(0))
	}
	n, err := lifecycle.Verify(filepath.Join(*dir, service.LogFile))
	if err != nil {
		return fail(stderr, "verify", err)
	}
	fmt.Fprintf(stdout, "%s verify: %d transitions, chain intact\n", prog, n)
	return exitOK
}
