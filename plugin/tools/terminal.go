package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/plugin/shared"
	"github.com/tetherdev/tether/receiver/wire"
)

// Output limits of terminal/create (bytes kept; the client truncates from
// the start beyond it).
const (
	DefaultOutputLimit = 1 << 20
	MaxOutputLimit     = 8 << 20
)

// CleanupTimeout bounds kill, output and release after a command's deadline
// passed or its caller cancelled.
const CleanupTimeout = 10 * time.Second

// DefaultPath is the PATH a command gets when its env sets none: the
// receiver builds a child's environment from nothing.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// brokerSlack is how long past the clean-up deadline the plugin waits for
// the host's report of a terminal run before it gives up on it.
const brokerSlack = 5 * time.Second

// Command is what run_command starts inside the computer.
type Command struct {
	Command     string
	Args        []string
	Cwd         string // relative to the root, or absolute inside it; "" = root
	Env         []acp.EnvVariable
	OutputLimit int // 0 = DefaultOutputLimit
	// Verify maps a file (relative to the root, or absolute inside it) to
	// its expected SHA-256 (hex) after the command exits; it travels as
	// `_meta["tether/verify"]` on terminal/create.
	Verify map[string]string
}

// CommandResult is how a command ended.
type CommandResult struct {
	TerminalID string
	Output     string
	Truncated  bool
	ExitCode   *int
	Signal     *string
	// TimedOut: the deadline passed first; the command was killed.
	TimedOut bool
	// Cancelled: the caller cancelled; the command was killed and its
	// terminal released before RunCommand returned.
	Cancelled bool
}

// StepError is a terminal run that failed at one of its ACP requests after
// the command had started: the terminal's kill or release.
type StepError struct {
	Step       string // "terminal/kill" or "terminal/release"
	TerminalID string
	Err        error // the client's error or the lost connection
}

func (e *StepError) Error() string {
	return fmt.Sprintf("run_command: %s of terminal %s failed: %s", e.Step, e.TerminalID, shared.PeerMessage(e.Err))
}

// Unwrap returns the step's error, so its tether code reads through.
func (e *StepError) Unwrap() error { return e.Err }

func (c Command) validate() error {
	switch {
	case c.Command == "":
		return wire.Errorf(wire.CodeInvalid, "run_command: command is required")
	case c.OutputLimit < 0 || c.OutputLimit > MaxOutputLimit:
		return wire.Errorf(wire.CodeInvalid, "run_command: output limit must be 0..%d bytes", MaxOutputLimit)
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

// RunCommand runs the command to its end with one RunTerminal call to the
// host, which sends terminal/create, terminal/wait_for_exit until the
// deadline, terminal/kill if the deadline passed or the caller cancelled,
// then terminal/output and terminal/release, each with the op tag built
// here. Every step's error passes the Backend (which fences on binding
// codes). A command past its deadline is reported TimedOut, a cancelled one
// Cancelled, both only after the kill and the release succeeded; a failed
// kill or release is a *StepError.
func RunCommand(ctx context.Context, c Call, cmd Command) (CommandResult, error) {
	run, err := c.terminalRun(cmd)
	if err != nil {
		return CommandResult{}, err
	}
	bctx, cancel := brokerContext(ctx, c.Deadline.Add(CleanupTimeout+brokerSlack))
	defer cancel()
	r, err := c.Backend.RunTerminal(bctx, run)
	if err != nil {
		return CommandResult{}, err
	}
	return commandResult(r)
}

// terminalRun checks cmd and builds the run: every request's op tag, the
// verify entry, the deadline and the clean-up bound.
func (c Call) terminalRun(cmd Command) (shared.TerminalRun, error) {
	if err := cmd.validate(); err != nil {
		return shared.TerminalRun{}, err
	}
	cwd, err := c.Resolve(orDot(cmd.Cwd))
	if err != nil {
		return shared.TerminalRun{}, err
	}
	verify, err := c.verifyMeta(cmd.Verify)
	if err != nil {
		return shared.TerminalRun{}, err
	}
	limit := cmd.OutputLimit
	if limit == 0 {
		limit = DefaultOutputLimit
	}
	create := acp.CreateTerminalRequest{SessionId: c.sid(), Command: cmd.Command, Args: cmd.Args, Cwd: &cwd,
		Env: withDefaultPath(cmd.Env), OutputByteLimit: &limit, Meta: c.meta("create", c.Deadline)}
	if verify != nil {
		create.Meta = acpmeta.MergeMeta(create.Meta, verify)
	}
	cleanup := c.Deadline.Add(CleanupTimeout)
	return shared.TerminalRun{Create: create, Deadline: c.Deadline, CleanupTimeout: CleanupTimeout,
		WaitMeta: c.meta("wait", c.Deadline), KillMeta: c.meta("kill", cleanup),
		OutputMeta: c.meta("output", cleanup), ReleaseMeta: c.meta("release", cleanup)}, nil
}

// brokerContext is the ctx of a RunTerminal call: it outlives the tool's
// deadline (the host kills, reads the output and releases past it, then
// answers) up to until, but ends at once if the tool call itself is
// abandoned (ctx cancelled rather than past its deadline).
func brokerContext(ctx context.Context, until time.Time) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	return bctx, func() { stop(); cancel() }
}

// commandResult turns the host's report into the tool's result.
func commandResult(r shared.TerminalResult) (CommandResult, error) {
	res := CommandResult{TerminalID: r.TerminalID, TimedOut: r.TimedOut, Cancelled: r.Cancelled}
	s := r.Steps
	switch {
	case !s.Create.Sent:
		return res, fmt.Errorf("run_command: %w before terminal/create; nothing was started", shared.ErrCancelled)
	case s.Create.Err != nil:
		return res, s.Create.Err
	case s.Wait.Err != nil: // the client refused the wait; the host released the terminal
		return res, s.Wait.Err
	case s.Kill.Err != nil:
		return res, &StepError{Step: "terminal/kill", TerminalID: r.TerminalID, Err: s.Kill.Err}
	case s.Output.Err != nil:
		return res, s.Output.Err
	case s.Release.Err != nil:
		return res, &StepError{Step: "terminal/release", TerminalID: r.TerminalID, Err: s.Release.Err}
	}
	res.Output, res.Truncated = r.Output, r.Truncated
	if r.Exit != nil {
		res.ExitCode, res.Signal = r.Exit.ExitCode, r.Exit.Signal
	}
	return res, nil
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
func (c Call) verifyMeta(files map[string]string) (map[string]any, error) {
	if len(files) == 0 {
		return nil, nil
	}
	if len(files) > acpmeta.MaxVerifyFiles {
		return nil, wire.Errorf(wire.CodeInvalid, "run_command: verify names %d files; at most %d", len(files), acpmeta.MaxVerifyFiles)
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
			return nil, wire.Errorf(wire.CodeInvalid, "run_command: verify names the tuple root %q; name a file", p)
		case !acpmeta.ValidDigest(sum):
			return nil, wire.Errorf(wire.CodeInvalid, "run_command: verify: the digest for %q is not a hex SHA-256", p)
		case dup:
			return nil, wire.Errorf(wire.CodeInvalid, "run_command: verify names %q twice", rel)
		}
		out[rel] = sum
	}
	v := acpmeta.Verify{Files: out}
	if err := v.Validate(); err != nil {
		return nil, wire.Errorf(wire.CodeInvalid, "run_command: %v", err)
	}
	return shared.RawMeta(acpmeta.KeyVerify, v), nil
}
