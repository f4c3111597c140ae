package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/admission/coordinator"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/admission/signing"
)

// Exit codes: 0 success, 1 a refused or failed operation (the reason is on
// stderr), 2 a usage error.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const usage = `usage: tether-admission <command> [flags]

commands:
  keygen      --out DIR                               write DIR/admission.key (0600) and DIR/admission.pub
  publish     --dir DIR --key FILE --grants FILE      sign and atomically publish DIR/` + admission.FileName + `
  inspect     --file FILE --pubkey FILE [--owner-uid N]   check a file exactly as the receiver does
  coordinate  --config FILE [--once]                  renew the OpenBao lease, then publish, every interval
                                                      (with "etcd" in the config: only the elected leader)

Run "tether-admission <command> --help" for a command's flags.
`

type command struct {
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{
	"keygen":     {runKeygen},
	"publish":    {runPublish},
	"inspect":    {runInspect},
	"coordinate": {runCoordinate},
}

// run dispatches to a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cli.UsageError(stderr, "tether-admission", "no command given")
	}
	if cli.IsHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		return cli.UsageError(stderr, "tether-admission", "unknown command %q", args[0])
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

// newFlags returns the flag set of subcommand name (admission/cli: --help
// prints to stdout, errors print to stderr with a hint).
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := cli.NewFlagSet("tether-admission "+name, "tether-admission "+synopsis, "")
	fs.SetOutput(stderr)
	return fs
}

// parse parses args; done is true when the caller must return code.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, done bool) {
	stderr := fs.Output()
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code, true
	}
	if fs.NArg() != 0 {
		return cli.UsageError(stderr, fs.Name(), "unexpected argument %q", fs.Arg(0)), true
	}
	return 0, false
}

// require reports the first empty required flag.
func require(fs *flag.FlagSet, names ...string) bool {
	for _, n := range names {
		if fs.Lookup(n).Value.String() == "" {
			cli.UsageError(fs.Output(), fs.Name(), "--%s is required", n)
			return false
		}
	}
	return true
}

func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "tether-admission %s: %v\n", cmd, err)
	return exitFail
}

func runKeygen(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("keygen", "keygen --out DIR", stderr)
	out := fs.String("out", "", "directory for admission.key (mode 0600) and admission.pub; created 0700 if missing; existing keys are never overwritten")
	if code, done := parse(fs, args, stdout); done {
		return code
	}
	if !require(fs, "out") {
		return exitUsage
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return fail(stderr, "keygen", err)
	}
	k, err := signing.GenerateKey()
	if err != nil {
		return fail(stderr, "keygen", err)
	}
	priv, pub := filepath.Join(*out, "admission.key"), filepath.Join(*out, "admission.pub")
	if err := signing.WritePrivateKey(priv, k); err != nil {
		return fail(stderr, "keygen", err)
	}
	if err := signing.WritePublicKey(pub, k.Public()); err != nil {
		os.Remove(priv)
		return fail(stderr, "keygen", err)
	}
	fmt.Fprintf(stdout, "key_id %s\nprivate %s\npublic %s\n", k.Public().KeyID(), priv, pub)
	return exitOK
}

func runPublish(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("publish", "publish --dir DIR --key FILE --grants FILE", stderr)
	dir := fs.String("dir", "", "admission directory (must exist; not group/world-writable; no symlinks)")
	keyPath := fs.String("key", "", "private signing key (PEM PKCS #8 ed25519, mode 0600)")
	grants := fs.String("grants", "", "publish input JSON (docs/admission.md); generation may be omitted")
	wait := fs.Duration("lock-timeout", 30*time.Second, "how long to wait for another publisher's lock")
	if code, done := parse(fs, args, stdout); done {
		return code
	}
	if !require(fs, "dir", "key", "grants") {
		return exitUsage
	}
	in, err := readInput(*grants)
	if err != nil {
		return fail(stderr, "publish", err)
	}
	k, err := signing.LoadPrivateKey(*keyPath)
	if err != nil {
		return fail(stderr, "publish", err)
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return fail(stderr, "publish", err)
	}
	p, err := signedfile.NewPublisher(signedfile.PublisherConfig{Dir: abs, Key: k})
	if err != nil {
		return fail(stderr, "publish", err)
	}
	ctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	pub, err := p.Publish(ctx, in)
	if err != nil {
		return fail(stderr, "publish", err)
	}
	fmt.Fprintf(stdout, "generation %d\nsha256 %s\n", pub.Generation, pub.SHA256)
	return exitOK
}

func readInput(path string) (admission.PublishInput, error) {
	f, err := os.Open(path)
	if err != nil {
		return admission.PublishInput{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, signedfile.HardMaxBytes+1))
	if err != nil {
		return admission.PublishInput{}, err
	}
	if len(data) > signedfile.HardMaxBytes {
		return admission.PublishInput{}, fmt.Errorf("%s is larger than %d bytes", path, signedfile.HardMaxBytes)
	}
	in, err := admission.DecodePublishInput(data)
	if err != nil {
		return admission.PublishInput{}, fmt.Errorf("%s: %w", path, err)
	}
	return in, nil
}

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("inspect", "inspect --file FILE --pubkey FILE [--owner-uid N]", stderr)
	file := fs.String("file", "", "admission file to check")
	pubPath := fs.String("pubkey", "", "pinned public key (PEM PKIX ed25519)")
	owner := fs.Int64("owner-uid", int64(os.Geteuid()), "uid that must own the file (the directory: this uid or root)")
	minGen := fs.Uint64("min-generation", 0, "refuse a generation lower than this, as a receiver that has seen it does")
	maxBytes := fs.Int64("max-bytes", signedfile.DefaultMaxBytes, "size limit")
	if code, done := parse(fs, args, stdout); done {
		return code
	}
	if !require(fs, "file", "pubkey") {
		return exitUsage
	}
	if *owner < 0 || *owner > 1<<32-1 {
		fmt.Fprintf(stderr, "tether-admission inspect: --owner-uid %d is not a uid\n", *owner)
		return exitUsage
	}
	pub, err := signing.LoadPublicKey(*pubPath)
	if err != nil {
		return fail(stderr, "inspect", err)
	}
	abs, err := filepath.Abs(*file)
	if err != nil {
		return fail(stderr, "inspect", err)
	}
	uid := uint32(*owner)
	l, err := signedfile.NewLoader(signedfile.LoaderConfig{Path: abs, PublicKey: pub, OwnerUID: &uid,
		MaxBytes: *maxBytes, MinGeneration: *minGen})
	if err != nil {
		return fail(stderr, "inspect", err)
	}
	ld, err := l.Load(ctx)
	if err != nil {
		return fail(stderr, "inspect", err)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(ld.Snapshot); err != nil {
		return fail(stderr, "inspect", err)
	}
	fmt.Fprintf(stderr, "valid: generation %d, sha256 %s, key %s\n", ld.Snapshot.Generation, ld.SHA256, pub.KeyID())
	return exitOK
}

func runCoordinate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("coordinate", "coordinate --config FILE [--once]", stderr)
	cfgPath := fs.String("config", "", "coordinator config JSON (docs/admission.md)")
	once := fs.Bool("once", false, "run one round and exit: 0 if it published, 1 if not")
	if code, done := parse(fs, args, stdout); done {
		return code
	}
	if !require(fs, "config") {
		return exitUsage
	}
	cfg, err := coordinator.LoadConfig(*cfgPath)
	if err != nil {
		return fail(stderr, "coordinate", err)
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		return fail(stderr, "coordinate", err)
	}
	defer c.Close()
	report := func(r coordinator.Round, err error) {
		if err != nil {
			fmt.Fprintf(stderr, "tether-admission coordinate: round failed: %v\n", err)
			return
		}
		fmt.Fprintf(stdout, "generation %d sha256 %s lease_expiry %s", r.Published.Generation,
			r.Published.SHA256, r.Lease.Expiry.UTC().Format(time.RFC3339))
		if r.Leader != 0 {
			fmt.Fprintf(stdout, " leader %d", r.Leader)
		}
		fmt.Fprintln(stdout)
	}
	if *once {
		r, err := c.RunOnce(ctx)
		report(r, err)
		if err != nil {
			return exitFail
		}
		return exitOK
	}
	if err := c.Run(ctx, report); err != nil && !errors.Is(err, context.Canceled) {
		return fail(stderr, "coordinate", err)
	}
	return exitOK
}
