package server

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

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/plugin/contract"
)

// Config is what Main serves. Versions defaults to contract.ProtocolVersions;
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
// name and returns the exit code. Asked for help (-h, -help, --help) by
// hand, without go-plugin's magic cookie in its environment, it prints its
// usage to stdout and returns 0 (admission/cli). Under go-plugin (the
// cookie set) stdout carries only go-plugin's handshake line, so help goes
// to stderr and it returns 2. Any other run by hand prints the usage to
// stderr and returns 2: the plugin is never meant to be run directly.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, cfg Config) int {
	if len(cfg.Versions) == 0 {
		cfg.Versions = contract.ProtocolVersions
	}
	underHost := os.Getenv(contract.Handshake.MagicCookieKey) == contract.Handshake.MagicCookieValue
	fs := flag.NewFlagSet("tether-plugin", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprintf(fs.Output(), usage, cfg.Versions) }
	procs := fs.Int("procs", DefaultProcs, "")
	helpOut := stdout
	if underHost {
		helpOut = stderr // stdout is go-plugin's handshake channel
	}
	if code, done := cli.Parse(fs, args, helpOut, stderr); done {
		if underHost {
			return cli.ExitUsage // nothing is served
		}
		return code
	}
	if *procs < 1 {
		return cli.UsageError(stderr, "tether-plugin", "--procs must be at least 1")
	}
	if fs.NArg() > 0 || !underHost {
		fs.SetOutput(stderr)
		fs.Usage()
		return cli.ExitUsage
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
		HandshakeConfig:  contract.Handshake,
		VersionedPlugins: contract.PluginSets(cfg.Versions, New(cfg.Now)),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(contract.ServerOptions(opts...)...)
		},
		Logger: hclog.New(&hclog.LoggerOptions{Name: "tether-plugin", Level: hclog.Info, Output: stderr, JSONFormat: true}),
	})
}
