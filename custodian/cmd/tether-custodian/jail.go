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
	spec, err := r.jailSpec()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := jail.Check(spec); err != nil {
		return nil, nil, nil, err
	}
	rec.Jailed, rec.JailSHA256 = true, spec.Digest()
	if err := c.RecordAgentStart(rec); err != nil {
		return nil, nil, nil, err
	}
	p, err := jail.Start(spec, stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	return p.Stdin, p.Stdout, jailedAgent{p}, nil
}

// jailSpec builds the jail from the config, the flags and the agent's
// argv. Everything the custodian holds stays hidden: its state, its keys
// and credentials, the receiver's socket, the config file.
func (r *runner) jailSpec() (*jail.Spec, error) {
	cfg := r.cfg.Jail
	var err error
	if cfg.Read, err = appendAbs(cfg.Read, r.jail.read); err != nil {
		return nil, err
	}
	if cfg.Exec, err = appendAbs(cfg.Exec, r.jail.exec); err != nil {
		return nil, err
	}
	r.jail.apply(&cfg)
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
		Hidden: hidden, Helper: jailHelper, Listen: r.cfg.Agent != custodian.AgentPlain})
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

// jailedAgent closes the agent's stdout once the jail ended.
type jailedAgent struct{ p *jail.Process }

func (j jailedAgent) Kill() error      { return j.p.Kill() }
func (j jailedAgent) Terminate() error { return j.p.Terminate() }

func (j jailedAgent) Wait() error {
	err := j.p.Wait()
	j.p.Stdout.Close()
	return err
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
