package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/egress/egresslog"
	"github.com/tetherdev/tether/egress/policy"
)

// maxPolicyFile bounds an --egress FILE.json.
const maxPolicyFile = 256 << 10

// egressOpts are the flags that say a computer's egress policy: rules
// and presets on the command line, or a whole policy in a JSON file.
type egressOpts struct {
	allow, deny rules
	presets     strList
	file        string
	noSNI       bool
}

// egressFlags adds the policy flags to fs.
func egressFlags(fs *flag.FlagSet) *egressOpts {
	o := &egressOpts{}
	fs.Var(&o.allow, "egress-allow", "allow HOST[:PORTS] (pypi.org, *.github.com:443) or CIDR[:PORTS] (203.0.113.0/24:80,443); "+
		"ports default to 80 and 443; repeatable")
	fs.Var(&o.deny, "egress-deny", "deny HOST[:PORTS] or CIDR[:PORTS], even where an allow or a preset matches; repeatable")
	fs.Var(&o.presets, "egress-preset", "add the rules of the operator's preset NAME; repeatable")
	fs.BoolVar(&o.noSNI, "egress-allow-no-sni", false, "let a CONNECT tunnel carry a TLS ClientHello without a server name")
	fs.StringVar(&o.file, "egress", "", "the whole egress policy as a JSON file (instead of the other --egress flags)")
	return o
}

// policy is the policy the flags say; none given is deny all.
func (o *egressOpts) policy() (policy.Policy, error) {
	if o.file == "" {
		p := policy.Policy{Allow: o.allow, Deny: o.deny, Presets: o.presets, AllowNoSNI: o.noSNI}
		return p, p.Validate()
	}
	if len(o.allow) > 0 || len(o.deny) > 0 || len(o.presets) > 0 || o.noSNI {
		return policy.Policy{}, fmt.Errorf("--egress FILE excludes the other --egress flags")
	}
	b, err := os.ReadFile(o.file)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("--egress: %w", err)
	}
	var p policy.Policy
	if err := strictjson.Decode(b, maxPolicyFile, &p); err != nil {
		return policy.Policy{}, fmt.Errorf("--egress %s: %w", o.file, err)
	}
	return p, p.Validate()
}

// rules is a repeatable HOST[:PORTS] or CIDR[:PORTS] flag.
type rules []policy.Rule

func (r *rules) String() string { return "" }

func (r *rules) Set(v string) error {
	rule, err := parseRule(v)
	if err != nil {
		return err
	}
	*r = append(*r, rule)
	return nil
}

// parseRule reads HOST[:PORTS] or CIDR[:PORTS]; PORTS is a comma list.
// A CIDR holds a "/", and its ports follow the prefix length, so an
// IPv6 prefix's colons are never taken for the port separator.
func parseRule(v string) (policy.Rule, error) {
	var r policy.Rule
	target, ports := v, ""
	if i := strings.LastIndexByte(v, '/'); i >= 0 {
		if pfx, ps, ok := strings.Cut(v[i:], ":"); ok {
			target, ports = v[:i]+pfx, ps
		}
		r.CIDR = target
	} else {
		if h, ps, ok := strings.Cut(v, ":"); ok {
			target, ports = h, ps
		}
		r.Host = target
	}
	if ports != "" || strings.HasSuffix(v, ":") {
		for _, p := range strings.Split(ports, ",") {
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil || n == 0 {
				return r, fmt.Errorf("rule %q: port %q is not 1 to 65535", v, p)
			}
			r.Ports = append(r.Ports, uint16(n))
		}
	}
	if err := r.Validate(); err != nil {
		return r, fmt.Errorf("rule %q: %w", v, err)
	}
	return r, nil
}

// strList is a repeatable string flag.
type strList []string

func (s *strList) String() string { return strings.Join(*s, ",") }

func (s *strList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

const egressUsage = `usage: tether-computer egress <command> [flags]

commands:
  show ID                        print a computer's egress policy (JSON), whether the proxy serves it,
                                 and the file inside it where refusals show
  set  ID [--egress-allow HOST[:PORTS]]... [--egress-deny ...]... [--egress-preset NAME]...
       | ID --egress FILE.json   replace a running computer's policy (none given: deny all)
  verify LOG                     check the proxy's hash-chained egress log (serve --egress-config's "log")
`

// runEgress dispatches egress show and egress set.
func runEgress(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cli.UsageError(stderr, prog+" egress", "no egress command given")
	}
	if cli.IsHelp(args[0]) {
		fmt.Fprint(stdout, egressUsage)
		return exitOK
	}
	switch args[0] {
	case "show":
		return idCommand("egress show", "print a computer's egress policy (JSON), whether the proxy serves it, "+
			"and the file in the computer where the proxy's refusals show", showEgress)(ctx, args[1:], stdout, stderr)
	case "set":
		return setEgress(ctx, args[1:], stdout, stderr)
	case "verify":
		return verifyEgressLog(args[1:], stdout, stderr)
	}
	return cli.UsageError(stderr, prog+" egress", "unknown egress command %q", args[0])
}

func showEgress(ctx context.Context, cl *client.Client, id string, stdout io.Writer) error {
	info, err := cl.Egress(ctx, id)
	if err == nil {
		printJSON(stdout, info)
	}
	return err
}

func setEgress(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("egress set", "egress set [flags] ID",
		"Replaces a running or suspended computer's egress policy and prints what the service stored.\n"+
			"New connections see it at once; open tunnels it no longer allows close within a second.\n"+
			"With no rule, preset or file the policy is deny all.", stderr)
	eg := egressFlags(fs)
	pos, code, done := parse(fs, args, stdout, 1)
	if done {
		return code
	}
	pol, err := eg.policy()
	if err != nil {
		return cli.UsageError(stderr, fs.Name(), "%v", err)
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "egress set", err)
	}
	info, err := cl.SetEgress(ctx, pos[0], pol)
	if err != nil {
		return fail(stderr, "egress set", err)
	}
	return printJSON(stdout, info)
}

// verifyEgressLog checks the egress log's chain and prints its head.
func verifyEgressLog(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog+" egress verify", prog+" egress verify LOG",
		"Checks the egress proxy's log: every record strict and canonical, numbered from 0, each\n"+
			"naming the hash of the line before. Prints the records and the head hash; keep the head\n"+
			"elsewhere to see a truncation. Names the first broken line; exits 1 then.")
	fs.SetOutput(stderr)
	pos, code, done := parse(fs, args, stdout, 1)
	if done {
		return code
	}
	head, err := egresslog.Verify(pos[0])
	if err != nil {
		return fail(stderr, "egress verify", err)
	}
	fmt.Fprintf(stdout, "%s egress verify: %d records, chain intact, head %s\n", prog, head.Records, head.Hash)
	return exitOK
}
