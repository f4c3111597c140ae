package toolplan

import (
	"strings"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// Output limits of terminal/create (bytes kept; the client truncates from
// the start beyond it).
const (
	DefaultOutputLimit = 1 << 20
	MaxOutputLimit     = 8 << 20
)

// CleanupTimeout bounds kill, output and release after a command's wait
// ended (it exited, its deadline passed or its caller cancelled).
const CleanupTimeout = 10 * time.Second

// DefaultPath is the PATH a command gets when its env sets none: the
// receiver builds a child's environment from nothing.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

func validate(cmd contract.RunTool) error {
	switch {
	case cmd.Command == "":
		return errcode.Errorf(errcode.CodeInvalid, "run_command: command is required")
	case cmd.OutputLimit < 0 || cmd.OutputLimit > MaxOutputLimit:
		return errcode.Errorf(errcode.CodeInvalid, "run_command: output limit must be 0..%d bytes", MaxOutputLimit)
	}
	return nil
}

func withDefaultPath(env []acp.EnvVariable) []acp.EnvVariable {
	for _, e := range env {
		if e.Name == "PATH" {
			return env
		}
	}
	return append(append([]acp.EnvVariable(nil), env...), acp.EnvVariable{Name: "PATH", Value: DefaultPath})
}

// Run plans run_command: one terminal run (terminal/create, wait_for_exit
// until the deadline, kill if the deadline passed or the caller cancelled,
// output, release), each request with its op tag. The working directory is
// resolved inside the root; verify travels as `_meta["tether/verify"]` on
// terminal/create.
func (c Call) Run(cmd contract.RunTool) (contract.TerminalStep, error) {
	if err := validate(cmd); err != nil {
		return contract.TerminalStep{}, err
	}
	cwd, err := c.Resolve(orDot(cmd.Cwd))
	if err != nil {
		return contract.TerminalStep{}, err
	}
	verify, err := c.verifyMeta(cmd.Verify)
	if err != nil {
		return contract.TerminalStep{}, err
	}
	limit := cmd.OutputLimit
	if limit == 0 {
		limit = DefaultOutputLimit
	}
	st := c.terminal(cmd.Command, cmd.Args, withDefaultPath(cmd.Env), limit)
	st.Cwd = cwd
	for k, v := range verify {
		st.CreateMeta[k] = v
	}
	return st, nil
}

// terminal is the run of argv with every request's op tag: create and wait
// carry the tool's deadline, kill, output and release that deadline plus
// the clean-up time.
func (c Call) terminal(command string, args []string, env []acp.EnvVariable, limit int) contract.TerminalStep {
	cleanup := c.Deadline.Add(CleanupTimeout)
	return contract.TerminalStep{Command: command, Args: args, Env: env, OutputLimit: limit, CleanupTimeout: CleanupTimeout,
		CreateMeta: c.meta("create", c.Deadline), WaitMeta: c.meta("wait", c.Deadline), KillMeta: c.meta("kill", cleanup),
		OutputMeta: c.meta("output", cleanup), ReleaseMeta: c.meta("release", cleanup)}
}

func orDot(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// verifyMeta checks the files to verify and returns their
// `_meta["tether/verify"]` entry (nil when there are none): each path is
// resolved inside the root and sent relative to it, each digest must be a
// hex SHA-256 (sent lowercase), at most acpmeta.MaxVerifyFiles.
func (c Call) verifyMeta(files map[string]string) (contract.Meta, error) {
	if len(files) == 0 {
		return nil, nil
	}
	if len(files) > acpmeta.MaxVerifyFiles {
		return nil, errcode.Errorf(errcode.CodeInvalid, "run_command: verify names %d files; at most %d", len(files), acpmeta.MaxVerifyFiles)
	}
	out := make(map[string]string, len(files))
	for p, d := range files {
		abs, err := c.Resolve(p)
		if err != nil {
			return nil, err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(abs, c.Root), "/")
		sum := strings.ToLower(d)
		switch _, dup := out[rel]; {
		case rel == "":
			return nil, errcode.Errorf(errcode.CodeInvalid, "run_command: verify names the tuple root %q; name a file", p)
		case !acpmeta.ValidDigest(sum):
			return nil, errcode.Errorf(errcode.CodeInvalid, "run_command: verify: the digest for %q is not a hex SHA-256", p)
		case dup:
			return nil, errcode.Errorf(errcode.CodeInvalid, "run_command: verify names %q twice", rel)
		}
		out[rel] = sum
	}
	v := acpmeta.Verify{Files: out}
	if err := v.Validate(); err != nil {
		return nil, errcode.Errorf(errcode.CodeInvalid, "run_command: %v", err)
	}
	return encodeMeta(acpmeta.KeyVerify, v), nil
}
