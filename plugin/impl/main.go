package impl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/tetherdev/tether/plugin/shared"
)

// Config is what Main serves. Versions defaults to shared.ProtocolVersions;
// tests set others to exercise a mismatch.
type Config struct {
	Versions []int
	// Now is the plugin's clock (time.Now if nil): leases end and
	// deadlines are reckoned on it. Only tests set it, to end a lease
	// when they choose instead of racing a short one.
	Now func() time.Time
}

const usage = `tether-plugin is a hashicorp/go-plugin binary (gRPC, AutoMTLS, protocol versions %v).
It is not meant to be run by hand: a host agent loads it with plugin/host.Load(ctx, path, sha256),
which checks the binary's SHA-256, starts it and talks to it over mutual TLS.
See docs/plugin.md.

Usage: tether-plugin [--procs N] [--help]

  --procs N  run Go code on at most N threads at once (GOMAXPROCS; default 1).
             The plugin spends its time waiting on its two gRPC connections;
             on one thread a message wakes no second thread, which makes each
             plugin hop cheaper. A host with many busy sessions may raise it
             (plugin/host.WithArgs("--procs", "4")).
`

// DefaultProcs is the plugin's GOMAXPROCS unless --procs says otherwise.
const DefaultProcs = 1

// Main runs tether-plugin with the command-line arguments after the program
// name and returns the exit code. Run by hand, or with --help or -h, it
// prints how it is meant to be used to stderr and returns 2: the plugin is
// never meant to be run directly, and stdout carries only go-plugin's
// handshake line.
func Main(ctx context.Context, args []string, stderr io.Writer, cfg Config) int {
	if len(cfg.Versions) == 0 {
		cfg.Versions = shared.ProtocolVersions
	}
	fs := flag.NewFlagSet("tether-plugin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintf(stderr, usage, cfg.Versions) }
	procs := fs.Int("procs", DefaultProcs, "")
	if err := fs.Parse(args); err != nil {
		return 2 // --help and -h too: fs.Usage went to stderr, nothing is served
	}
	if *procs < 1 {
		fmt.Fprintf(stderr, "tether-plugin: --procs must be at least 1\n")
		return 2
	}
	if fs.NArg() > 0 || os.Getenv(shared.Handshake.MagicCookieKey) != shared.Handshake.MagicCookieValue {
		fs.Usage()
		return 2
	}
	if err := checkLaunch(os.Getenv("PLUGIN_PROTOCOL_VERSIONS"), os.Getenv("PLUGIN_CLIENT_CERT"), cfg.Versions); err != nil {
		fmt.Fprintf(stderr, "tether-plugin: %v\n", err)
		return 3
	}
	if err := detachStdin(); err != nil {
		fmt.Fprintf(stderr, "tether-plugin: %v\n", err)
		return 1
	}
	runtime.GOMAXPROCS(*procs)
	go watchParent(ctx, stderr, time.Second)
	serve(ctx, stderr, cfg)
	return 0
}

// watchParent ends the plugin when its host went away without closing it
// (the host was killed): the plugin is then reparented, and nothing it
// serves has a caller any more. It polls the parent pid, because a
// parent-death signal would follow the host's forking thread, not the
// host process.
func watchParent(ctx context.Context, stderr io.Writer, every time.Duration) {
	ppid := os.Getppid()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if os.Getppid() != ppid {
				fmt.Fprintf(stderr, "tether-plugin: host process %d is gone; exiting\n", ppid)
				os.Exit(1)
			}
		}
	}
}

// ErrVersionMismatch: host and plugin share no protocol version.
var ErrVersionMismatch = errors.New("protocol version mismatch")

// ErrNoMTLS: the host did not start the plugin with AutoMTLS.
var ErrNoMTLS = errors.New("host did not enable AutoMTLS")

// checkLaunch refuses a host that offers no version this plugin speaks (the
// error names both lists) or that did not enable AutoMTLS.
func checkLaunch(offered, clientCert string, versions []int) error {
	var host []int
	for _, f := range strings.Split(offered, ",") {
		if v, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			host = append(host, v)
		}
	}
	common := slices.ContainsFunc(host, func(v int) bool { return slices.Contains(versions, v) })
	switch {
	case !common:
		slices.Sort(host)
		return fmt.Errorf("%w: this plugin speaks protocol versions %v; the host speaks %v (upgrade the older side)",
			ErrVersionMismatch, versions, host)
	case clientCert == "":
		return fmt.Errorf("%w: refusing to serve without mutual TLS (set ClientConfig.AutoMTLS)", ErrNoMTLS)
	}
	return nil
}

func serve(ctx context.Context, stderr io.Writer, cfg Config) {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  shared.Handshake,
		VersionedPlugins: shared.PluginSets(cfg.Versions, New(cfg.Now)),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(shared.ServerOptions(opts...)...)
		},
		Logger: hclog.New(&hclog.LoggerOptions{Name: "tether-plugin", Level: hclog.Info, Output: stderr, JSONFormat: true}),
	})
}
