package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/jail"
	"github.com/tetherdev/tether/egress/policy"
)

// jailFlags are run's flags for the agent jail.
type jailFlags struct {
	off          bool
	read, exec   prompts // repeatable string flags
	memory, pids int64
	cgroup       string
}

// addJailFlags registers --no-jail, --jail-read, --jail-exec,
// --jail-memory, --jail-pids and --jail-cgroup on fs.
func addJailFlags(fs *flag.FlagSet) *jailFlags {
	j := &jailFlags{}
	fs.BoolVar(&j.off, "no-jail", false, "start the agent unconfined (recorded in the audit log); by default it runs in the agent jail")
	fs.Var(&j.read, "jail-read", "a path the jailed agent may read, e.g. its install tree (repeatable; extends config jail.read)")
	fs.Var(&j.exec, "jail-exec", "an executable the jailed agent may run, e.g. node (repeatable; extends config jail.exec)")
	fs.Int64Var(&j.memory, "jail-memory", 0, fmt.Sprintf("the jail's memory limit in bytes, no swap (overrides config jail.max_memory_bytes; default %d)", int64(jail.DefaultMaxMemory)))
	fs.Int64Var(&j.pids, "jail-pids", 0, fmt.Sprintf("the jail's limit on processes and threads (overrides config jail.max_pids; default %d)", jail.DefaultMaxPids))
	fs.StringVar(&j.cgroup, "jail-cgroup", "", `"off" runs the jail without its cgroup: no memory limit, processes bounded by RLIMIT_NPROC only (overrides config jail.cgroup; default required)`)
	return j
}

// apply lays the limit flags over the config's jail section.
func (j *jailFlags) apply(cfg *jail.Config) {
	if j.memory != 0 {
		cfg.MaxMemoryBytes = &j.memory
	}
	if j.pids != 0 {
		cfg.MaxPids = &j.pids
	}
	if j.cgroup != "" {
		cfg.Cgroup = j.cgroup
	}
}

// jailHelper, set only by tests, is the binary shown inside the jail as
// its init and shell stubs instead of this one (a test binary lives where
// the agent's uid cannot reach it).
var jailHelper string

// agentProc is the agent process, jailed or not.
type agentProc interface {
	Wait() error
	// Terminate sends SIGTERM to the agent (and, jailed, to what it
	// started); Kill sends SIGKILL.
	Terminate() error
	Kill() error
}

// askedToEnd is the error of an agent that ended after Terminate: its own
// exit status is dropped (it was asked to end), anything else is kept,
// such as the jail failing to empty HOME and /tmp.
func askedToEnd(err error) error {
	if errors.Is(err, jail.ErrCleanup) {
		return err
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return nil
	}
	return err
}

// startAgent records the agent's start in the audit log, then starts it:
// in the jail, or unconfined with --no-jail. Nothing is started when the
// record cannot be written. The agent's stderr goes to stderr.
func (r *runner) startAgent(c *custodian.Custodian, stderr io.Writer) (io.WriteCloser, io.ReadCloser, agentProc, error) {
	rec := custodian.AgentStart{TupleSHA256: r.cfg.Tuple.SHA256(), Principal: r.cfg.Principal, ArgvSHA256: argvDigest(r.argv)}
	if r.jail == nil || r.jail.off {
		if err := c.RecordAgentStart(rec); err != nil {
			return nil, nil, nil, err
		}
		return startPlain(r.argv, r.env, stderr)
	}
	spec, closeEgress, err := r.jailSpec()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := jail.Check(spec); err != nil {
		return nil, nil, nil, errors.Join(err, closeEgress())
	}
	rec.Jailed, rec.JailSHA256, rec.Network = true, spec.Digest(), spec.Network
	if err := c.RecordAgentStart(rec); err != nil {
		return nil, nil, nil, errors.Join(err, closeEgress())
	}
	p, err := jail.Start(spec, stderr)
	if err != nil {
		return nil, nil, nil, errors.Join(err, closeEgress())
	}
	return p.Stdin, p.Stdout, jailedAgent{p, closeEgress}, nil
}

// newAgentEgress starts the egress proxy that serves the agent's jail
// under jail.network "proxy", knowing presets, with its log in stateDir;
// close stops it (agentegress.go sets it to package egress's proxy).
// Were it nil, the default would stay "host" and an explicit "proxy"
// would be refused by name.
var newAgentEgress func(stateDir string, presets []policy.Preset) (eg jail.Egress, close func() error, err error)

// egressFor settles the jail's network (agentNetwork) and, under
// "proxy", starts the agent's egress proxy. close is never nil.
func (r *runner) egressFor(cfg *jail.Config) (jail.Egress, func() error, error) {
	none := func() error { return nil }
	settled, presets, err := agentNetwork(*cfg, r.profile, r.env, newAgentEgress != nil)
	if err != nil {
		return nil, none, err
	}
	*cfg = settled
	if cfg.Network != jail.NetworkProxy {
		return nil, none, nil
	}
	if newAgentEgress == nil {
		return nil, none, fmt.Errorf("%w: jail.network %q: this tether-custodian has no egress proxy", jail.ErrConfig, jail.NetworkProxy)
	}
	eg, closeEg, err := newAgentEgress(r.cfg.StateDir, presets)
	if err != nil {
		return nil, none, fmt.Errorf("%w: start the agent's egress proxy: %w", jail.ErrStart, err)
	}
	return eg, closeEg, nil
}

// jailSpec builds the jail from the config, the flags, the agent's argv
// and its profile's endpoint (egressFor). Everything the custodian holds
// stays hidden: its state, its keys and credentials, the receiver's
// socket, the config file. closeEgress stops the agent's egress proxy,
// if one was started; the caller calls it once the agent has ended (or
// did not start).
func (r *runner) jailSpec() (spec *jail.Spec, closeEgress func() error, err error) {
	cfg := r.cfg.Jail
	if cfg.Read, err = appendAbs(cfg.Read, r.jail.read); err != nil {
		return nil, nil, err
	}
	if cfg.Exec, err = appendAbs(cfg.Exec, r.jail.exec); err != nil {
		return nil, nil, err
	}
	r.jail.apply(&cfg)
	eg, closeEgress, err := r.egressFor(&cfg)
	if err != nil {
		return nil, nil, err
	}
	spec, err = r.buildJail(cfg, eg)
	if err != nil {
		return nil, nil, errors.Join(err, closeEgress())
	}
	return spec, closeEgress, nil
}

// buildJail resolves the jail of cfg, served by eg under "proxy".
func (r *runner) buildJail(cfg jail.Config, eg jail.Egress) (*jail.Spec, error) {
	rc := r.cfg.Receiver
	configPath, err := filepath.Abs(r.configPath)
	if err != nil {
		return nil, fmt.Errorf("%w: config path: %w", jail.ErrConfig, err)
	}
	hidden := []string{r.cfg.StateDir, r.cfg.AuditKeyFile, rc.CAFile, rc.CertFile, rc.KeyFile, configPath}
	if rc.Path != "" {
		hidden = append(hidden, rc.Path)
	}
	// A tether agent loads the plugin, which serves go-plugin's unix
	// socket: it may listen (bind stays refused); a plain agent may not.
	return jail.Build(jail.Options{Config: cfg, Argv: r.argv, Root: r.cfg.Tuple.Root, Env: r.env,
		Hidden: hidden, Helper: jailHelper, Listen: r.cfg.Agent != custodian.AgentPlain, Egress: eg})
}

// appendAbs appends the flag paths, made absolute, to the config's.
func appendAbs(base []string, flags []string) ([]string, error) {
	out := slices.Clone(base)
	for _, p := range flags {
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", jail.ErrConfig, p, err)
		}
		out = append(out, abs)
	}
	return out, nil
}

func argvDigest(argv []string) string {
	sum := sha256.Sum256([]byte(strings.Join(argv, "\x00")))
	return hex.EncodeToString(sum[:])
}

// jailedAgent closes the agent's stdout and stops its egress proxy once
// the jail ended.
type jailedAgent struct {
	p           *jail.Process
	closeEgress func() error
}

func (j jailedAgent) Kill() error      { return j.p.Kill() }
func (j jailedAgent) Terminate() error { return j.p.Terminate() }

func (j jailedAgent) Wait() error {
	err := j.p.Wait()
	j.p.Stdout.Close()
	return errors.Join(err, j.closeEgress())
}

// plainAgent is an agent started without the jail (--no-jail).
type plainAgent struct{ cmd *exec.Cmd }

func startPlain(argv, env []string, stderr io.Writer) (io.WriteCloser, io.ReadCloser, agentProc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stderr = stderr
	toAgent, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	fromAgent, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return toAgent, fromAgent, plainAgent{cmd}, nil
}

func (a plainAgent) Wait() error { return a.cmd.Wait() }

func (a plainAgent) Terminate() error {
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (a plainAgent) Kill() error {
	if err := a.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}
