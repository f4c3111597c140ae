package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/computer/httpserver"
)

// Exit codes: 0 success, 1 a refused or failed operation (the error
// code and reason are on stderr), 2 a usage error.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// DefaultSocket is where the daemon listens unless told otherwise.
const DefaultSocket = client.DefaultSocket

// envSocket names the variable that changes the default socket, for
// the daemon and its clients alike.
const envSocket = "TETHER_COMPUTER_SOCKET"

// defaultSocket is $TETHER_COMPUTER_SOCKET, else DefaultSocket.
func defaultSocket() string {
	if s := os.Getenv(envSocket); s != "" {
		return s
	}
	return DefaultSocket
}

// envToken names the variable a bearer token may come in (never argv).
const envToken = "TETHER_COMPUTER_TOKEN"

const prog = "tether-computer"

const usage = `usage: tether-computer <command> [flags]

commands:
  create   [--tier vm [--screen]] [--memory BYTES] [--pids N] [--disk BYTES] [--ttl DUR] [--idle DUR] [--label K=V]...
           [--seed DIR | --seed-bundle FILE]
           [--egress-allow HOST[:PORTS]]... [--egress-deny ...]... [--egress-preset NAME]... | [--egress FILE]
                                 make a computer and print it (JSON) once it runs
  ls                             list your computers (an admin sees all)
  show     ID                    print one computer (JSON)
  rm       ID                    withdraw its grant, kill what runs, tear it down
  renew    --ttl DUR ID          extend the lease
  suspend  ID                    freeze its commands (memory kept; a VM stops whole: QMP stop)
  resume   ID                    thaw it
  touch    ID                    record activity (resumes a suspended computer)
  link     [--role view|control] [--ttl 1h] ID
                                 mint a one-time link to a screen computer's live view (its owner only)
  receipts ID                    the receipts (SHA-256) of its exports, imports and copies
  egress   show ID | set ID ... | verify LOG
                                 its egress policy (what it may reach through the host's proxy); the proxy's log
  cp       SRC DST               copy a file or folder in or out (either tier); one side is ID:/path (receipt: JSON)
  export   ID -o FILE            write a suspended computer's root as tar.zst; prints its SHA-256
  import   FILE --sha256 HEX     make a computer from an export, after the daemon checks its digest
  token add --file FILE --owner NAME [--admin]
                                 add a bearer token to the daemon's token file; prints it once
  serve    [--dir DIR] [--socket PATH] [--group G] [--pool N] [--max-computers N] ...
                                 run the daemon (root): state, API, leases, idle suspend, pool
  verify   [--dir DIR]           check the daemon's hash-chained transition log
  demo     [--bin DIR]           the service at work (pool, lease, suspend, expiry), embedded
  demo-view [--for DUR]          a VM computer with a screen: prints a control and a view-only link

Every command but token, serve and verify takes --socket PATH (default ` + DefaultSocket + `,
or $` + envSocket + `), or
--url https://HOST:PORT with the token in $` + envToken + ` or --token-file
and the server's CA in --ca. Run "tether-computer <command> --help" for its flags.
`

type command func(ctx context.Context, args []string, stdout, stderr io.Writer) int

var commands = map[string]command{
	"create":    runCreate,
	"ls":        runList,
	"show":      runShow,
	"rm":        idCommand("rm", "end a computer: withdraw its grant, kill what runs, tear down", removeOne),
	"renew":     runRenew,
	"suspend":   idCommand("suspend", "freeze a computer's commands; its receiver keeps answering", suspendOne),
	"resume":    idCommand("resume", "thaw a suspended computer", resumeOne),
	"touch":     idCommand("touch", "record activity on a computer, resuming it when suspended", touchOne),
	"link":      runLink,
	"demo-view": runDemoView,
	"receipts":  idCommand("receipts", "list the receipts (SHA-256) of a computer's exports, imports and copies", receiptsOf),
	"cp":        runCopy,
	"egress":    runEgress,
	"export":    runExport,
	"import":    runImport,
	"token":     runToken,
	"serve":     runServe,
	"verify":    runVerify,
	"demo":      runDemo,
}

// run dispatches to a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cli.UsageError(stderr, prog, "no command given")
	}
	if cli.IsHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		return cli.UsageError(stderr, prog, "unknown command %q", args[0])
	}
	return c(ctx, args[1:], stdout, stderr)
}

// socketWait is how long a command waits for the daemon's socket to
// appear: `serve &` followed at once by a command is the common start.
const socketWait = 5 * time.Second

// waitSocket waits until path is a socket, at most d; the daemon makes
// it only once it serves.
func waitSocket(path string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		fi, err := os.Stat(path)
		if err == nil && fi.Mode().Type() == os.ModeSocket {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no computer service at %s (start one with: tether-computer serve): %w", path, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a path another process creates; no event to wait on
	}
}

// conn holds the connection flags every daemon command shares.
type conn struct {
	socket, url, tokenFile, ca string
}

// newFlags returns subcommand name's flag set with the connection flags.
func newFlags(name, synopsis, text string, stderr io.Writer) (*flag.FlagSet, *conn) {
	fs := cli.NewFlagSet(prog+" "+name, prog+" "+synopsis, text)
	fs.SetOutput(stderr)
	c := &conn{}
	fs.StringVar(&c.socket, "socket", defaultSocket(), "the daemon's unix socket (peer credentials decide who you are; $"+envSocket+" changes the default)")
	fs.StringVar(&c.url, "url", "", "the daemon's TLS listener, https://HOST:PORT, instead of the socket (needs a token)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the bearer token for --url (else $"+envToken+")")
	fs.StringVar(&c.ca, "ca", "", "PEM CA bundle that signs the daemon's certificate for --url (else the system roots)")
	return fs, c
}

// parse parses args, taking at most want positional arguments (flags may
// follow them); done is true when the caller must return code.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer, want int) (pos []string, code int, done bool) {
	stderr := fs.Output()
	for {
		if code, done := cli.Parse(fs, args, stdout, stderr); done {
			return nil, code, true
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != want {
		return nil, cli.UsageError(stderr, fs.Name(), "want %d argument(s), got %d", want, len(pos)), true
	}
	return pos, 0, false
}

// client makes the client the flags name.
func (c *conn) client() (*client.Client, error) {
	if c.url == "" {
		if err := waitSocket(c.socket, socketWait); err != nil {
			return nil, err
		}
		return client.Unix(c.socket), nil
	}
	tok := os.Getenv(envToken)
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("read token: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok == "" {
		return nil, fmt.Errorf("--url needs a token: --token-file or $%s", envToken)
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS13}
	if c.ca != "" {
		pem, err := os.ReadFile(c.ca)
		if err != nil {
			return nil, fmt.Errorf("read CA: %w", err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca %s holds no PEM certificate", c.ca)
		}
	}
	return client.HTTPS(c.url, tok, conf)
}

// fail prints err (its code first when it is an error answer) and
// returns exitFail.
func fail(stderr io.Writer, cmd string, err error) int {
	var e *api.Error
	if errors.As(err, &e) {
		fmt.Fprintf(stderr, "%s %s: %s: %s\n", prog, cmd, e.Code, e.Message)
	} else {
		fmt.Fprintf(stderr, "%s %s: %v\n", prog, cmd, err)
	}
	return exitFail
}

// printJSON prints v indented.
func printJSON(w io.Writer, v any) int {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return exitFail
	}
	fmt.Fprintf(w, "%s\n", b)
	return exitOK
}

// labels is a repeatable --label K=V flag.
type labels map[string]string

func (l labels) String() string { return "" }

func (l labels) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("label %q is not KEY=VALUE", v)
	}
	if _, dup := l[k]; dup {
		return fmt.Errorf("label %q given twice", k)
	}
	l[k] = val
	return nil
}

func runCreate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("create", "create [flags]", "Makes a computer and prints it (JSON) once it runs; while the host is at capacity it waits in the queue.\n"+
		"--seed DIR copies the folder's contents into the new root, --seed-bundle FILE a git clone of the\n"+
		"bundle (the seed's receipt goes to stderr); a computer whose seed fails is deleted.\n"+
		"Without --egress flags it reaches nothing beyond its loopback; with them, what they allow through\n"+
		"the host's egress proxy (the service needs serve --egress-config).\n"+
		"--screen (with --tier vm) gives the computer a display and a live view; mint its links with 'link'.", stderr)
	opts := createFlags(fs)
	screen := fs.Bool("screen", false, "give the VM computer a display and a live view (with --tier vm)")
	lbl := labels{}
	fs.Var(lbl, "label", "KEY=VALUE label; repeatable")
	seed := fs.String("seed", "", "local folder whose contents fill the new computer's root")
	bundle := fs.String("seed-bundle", "", "git bundle cloned (by the local git) into the new computer's root")
	field := fieldFlag(fs)
	eg := egressFlags(fs)
	if _, code, done := parse(fs, args, stdout, 0); done {
		return code
	}
	if *seed != "" && *bundle != "" {
		return cli.UsageError(stderr, fs.Name(), "--seed and --seed-bundle exclude each other")
	}
	pol, err := eg.policy()
	if err != nil {
		return cli.UsageError(stderr, fs.Name(), "%v", err)
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "create", err)
	}
	req := opts.request()
	req.Egress, req.Screen = pol, *screen
	if len(lbl) > 0 {
		req.Labels = lbl
	}
	comp, err := cl.Create(ctx, req)
	if err != nil {
		return fail(stderr, "create", err)
	}
	if *seed != "" || *bundle != "" {
		rec, err := seedRoot(ctx, cl, comp.ID, *seed, *bundle)
		if err != nil {
			err = errors.Join(fmt.Errorf("seed %s: %w", comp.ID, err), cl.Delete(context.WithoutCancel(ctx), comp.ID))
			return fail(stderr, "create", err)
		}
		fmt.Fprintf(stderr, "%s create: seeded %s: sha256 %s, %d bytes, %d entries\n", prog, comp.ID, rec.SHA256, rec.Bytes, rec.Files)
	}
	if err := printComputer(stdout, comp, *field); err != nil {
		return fail(stderr, "create", err)
	}
	return exitOK
}

func seconds(d time.Duration) int64 { return int64(d / time.Second) }

func runList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("ls", "ls [flags]", "Lists your computers (an admin sees every owner's).", stderr)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	if _, code, done := parse(fs, args, stdout, 0); done {
		return code
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "ls", err)
	}
	cs, err := cl.List(ctx)
	if err != nil {
		return fail(stderr, "ls", err)
	}
	if *asJSON {
		return printJSON(stdout, api.ComputerList{Computers: cs})
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tOWNER\tSTATE\tTIER\tLEASE EXPIRES")
	for _, x := range cs {
		exp := "-"
		if !x.LeaseExpiresAt.IsZero() {
			exp = x.LeaseExpiresAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", x.ID, x.Owner, x.State, x.Tier, exp)
	}
	tw.Flush()
	return exitOK
}

// idCommand makes a subcommand that takes one computer id.
func idCommand(name, text string, do func(ctx context.Context, cl *client.Client, id string, stdout io.Writer) error) command {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		fs, c := newFlags(name, name+" [flags] ID", text, stderr)
		pos, code, done := parse(fs, args, stdout, 1)
		if done {
			return code
		}
		cl, err := c.client()
		if err == nil {
			err = do(ctx, cl, pos[0], stdout)
		}
		if err != nil {
			return fail(stderr, name, err)
		}
		return exitOK
	}
}

func runShow(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("show", "show [flags] ID", "print one computer (JSON)", stderr)
	field := fieldFlag(fs)
	pos, code, done := parse(fs, args, stdout, 1)
	if done {
		return code
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "show", err)
	}
	comp, err := cl.Get(ctx, pos[0])
	if err == nil {
		err = printComputer(stdout, comp, *field)
	}
	if err != nil {
		return fail(stderr, "show", err)
	}
	return exitOK
}

// fieldFlag is --field: print one field of the computer instead of all.
func fieldFlag(fs *flag.FlagSet) *string {
	return fs.String("field", "", "print only this field of the computer, by its JSON name (\"id\", \"custodian_config\", \"tuple.root\"), for scripts")
}

// printComputer prints comp as JSON, or only its field (a dotted JSON
// path to a string or number) on one line.
func printComputer(w io.Writer, comp api.Computer, field string) error {
	if field == "" {
		printJSON(w, comp)
		return nil
	}
	raw, err := json.Marshal(comp)
	if err != nil {
		return err
	}
	var v any
	if err := strictjson.Decode(raw, len(raw), &v); err != nil {
		return err
	}
	for _, k := range strings.Split(field, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("--field %s: %q is not an object", field, k)
		}
		if v, ok = m[k]; !ok {
			return fmt.Errorf("--field %s: no field %q", field, k)
		}
	}
	switch x := v.(type) {
	case string, float64, bool:
		fmt.Fprintln(w, x)
		return nil
	}
	return fmt.Errorf("--field %s is not a string, number or boolean", field)
}

func removeOne(ctx context.Context, cl *client.Client, id string, stdout io.Writer) error {
	return cl.Delete(ctx, id)
}

func suspendOne(ctx context.Context, cl *client.Client, id string, stdout io.Writer) error {
	comp, err := cl.Suspend(ctx, id)
	if err == nil {
		printJSON(stdout, comp)
	}
	return err
}

func resumeOne(ctx context.Context, cl *client.Client, id string, stdout io.Writer) error {
	comp, err := cl.Resume(ctx, id)
	if err == nil {
		printJSON(stdout, comp)
	}
	return err
}

func runRenew(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("renew", "renew --ttl DUR [flags] ID", "Extends a computer's lease by --ttl from now, up to the service's maximum.", stderr)
	ttl := fs.Duration("ttl", 0, "the new lease, whole seconds; required")
	pos, code, done := parse(fs, args, stdout, 1)
	if done {
		return code
	}
	if *ttl < time.Second {
		return cli.UsageError(stderr, fs.Name(), "--ttl of at least 1s is required")
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "renew", err)
	}
	comp, err := cl.Renew(ctx, pos[0], *ttl)
	if err != nil {
		return fail(stderr, "renew", err)
	}
	return printJSON(stdout, comp)
}

const tokenUsage = `usage: tether-computer token add --file FILE --owner NAME [--admin]

commands:
  add   make a bearer token for OWNER, store only its SHA-256 in FILE
        (created 0600, replaced atomically) and print the token once
`

func runToken(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cli.UsageError(stderr, prog+" token", "no token command given")
	}
	if cli.IsHelp(args[0]) {
		fmt.Fprint(stdout, tokenUsage)
		return exitOK
	}
	if args[0] != "add" {
		return cli.UsageError(stderr, prog+" token", "unknown token command %q", args[0])
	}
	fs := cli.NewFlagSet(prog+" token add", prog+" token add --file FILE --owner NAME [--admin]",
		"Prints the new token once on stdout; the file keeps only its hash. Give it to the owner over a private channel.")
	fs.SetOutput(stderr)
	file := fs.String("file", "", "the daemon's token file; required")
	owner := fs.String("owner", "", "the owner the token acts as; required")
	admin := fs.Bool("admin", false, "the token sees and touches every owner's computers")
	if _, code, done := parse(fs, args[1:], stdout, 0); done {
		return code
	}
	if *file == "" || *owner == "" {
		return cli.UsageError(stderr, fs.Name(), "--file and --owner are required")
	}
	tok, err := httpserver.AddToken(*file, *owner, *admin)
	if err != nil {
		return fail(stderr, "token add", err)
	}
	fmt.Fprintln(stdout, tok)
	return exitOK
}
