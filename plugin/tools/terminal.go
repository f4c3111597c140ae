package tools

import (
	"context"
	"errors"
	"fmt"
	"time"

	acp "github.com/coder/acp-go-sdk"

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

// Command is what run_command starts inside the computer.
type Command struct {
	Command     string
	Args        []string
	Cwd         string // relative to the root, or absolute inside it; "" = root
	Env         []acp.EnvVariable
	OutputLimit int // 0 = DefaultOutputLimit
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
}

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

// RunCommand sends terminal/create, waits with terminal/wait_for_exit until
// ctx's deadline, then terminal/output and terminal/release. If the
// deadline passes first, terminal/kill ends the command and the result says
// TimedOut. If the caller cancels, the command is killed and released and
// the cancellation is returned.
func RunCommand(ctx context.Context, c Call, cmd Command) (CommandResult, error) {
	if err := cmd.validate(); err != nil {
		return CommandResult{}, err
	}
	cwd, err := c.Resolve(orDot(cmd.Cwd))
	if err != nil {
		return CommandResult{}, err
	}
	limit := cmd.OutputLimit
	if limit == 0 {
		limit = DefaultOutputLimit
	}
	created, err := c.Backend.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: c.sid(), Command: cmd.Command,
		Args: cmd.Args, Cwd: &cwd, Env: withDefaultPath(cmd.Env), OutputByteLimit: &limit, Meta: c.meta("create", c.Deadline)})
	if err != nil {
		return CommandResult{}, err
	}
	res := CommandResult{TerminalID: created.TerminalId}
	exit, werr := c.Backend.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: c.sid(),
		TerminalId: res.TerminalID, Meta: c.meta("wait", c.Deadline)})

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
	defer cancel()
	cdl, _ := cctx.Deadline()
	if werr != nil && ctx.Err() == nil {
		// The client refused the wait: release the terminal, report why.
		_ = c.release(cctx, res.TerminalID, cdl)
		return res, werr
	}
	if werr != nil {
		res.TimedOut = errors.Is(ctx.Err(), context.DeadlineExceeded)
		if _, err := c.Backend.KillTerminal(cctx, acp.KillTerminalRequest{SessionId: c.sid(),
			TerminalId: res.TerminalID, Meta: c.meta("kill", cdl)}); err != nil {
			_ = c.release(cctx, res.TerminalID, cdl)
			return res, fmt.Errorf("kill terminal %s after %v: %w", res.TerminalID, ctx.Err(), err)
		}
	}
	oerr := c.output(cctx, &res, cdl)
	if werr == nil && res.ExitCode == nil && res.Signal == nil {
		res.ExitCode, res.Signal = exit.ExitCode, exit.Signal
	}
	rerr := c.release(cctx, res.TerminalID, cdl)
	switch {
	case werr != nil && !res.TimedOut:
		return res, fmt.Errorf("run_command: %w", ctx.Err())
	case oerr != nil:
		return res, oerr
	}
	return res, rerr
}

func orDot(p string) string {
	if p == "" {
		return "."
	}
	return p
}

func (c Call) output(ctx context.Context, res *CommandResult, deadline time.Time) error {
	out, err := c.Backend.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: c.sid(),
		TerminalId: res.TerminalID, Meta: c.meta("output", deadline)})
	if err != nil {
		return err
	}
	res.Output, res.Truncated = out.Output, out.Truncated
	if out.ExitStatus != nil {
		res.ExitCode, res.Signal = out.ExitStatus.ExitCode, out.ExitStatus.Signal
	}
	return nil
}

func (c Call) release(ctx context.Context, tid string, deadline time.Time) error {
	_, err := c.Backend.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: c.sid(), TerminalId: tid,
		Meta: c.meta("release", deadline)})
	return err
}
