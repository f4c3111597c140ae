package host

import (
	"context"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/plugin/contract"
	"github.com/tetherdev/tether/plugin/toolplan"
)

// The tool calls. Each runs only in a bound session, as one call to the
// plugin (its plan, or its refusal: a *errcode.Error, acperr.CodeOf reads
// it) and then the plan's requests on the connection. o may be zero. If
// the caller cancels ctx, nothing more is sent for the call; a running
// command is killed, its output read and its terminal released, and the
// call returns after that clean-up with a *CancelledError (errors.Is(err,
// ErrCancelled)), or with the result of work that finished first. None of
// that waits on the plugin.

// ReadTextFile runs read_text_file: line is 1-based (0 = from the start),
// limit a line count (0 = to the end).
func (c *Conn) ReadTextFile(ctx context.Context, sessionID string, o CallOptions, path string, line, limit int) (ReadResult, error) {
	x, err := c.authorize(ctx, sessionID, o, contract.ReadTool{Path: path, Line: line, Limit: limit})
	if err != nil {
		return ReadResult{}, err
	}
	st := x.plan.Step.(contract.ReadStep)
	content, err := x.read(ctx, st.Path, st.Line, st.Limit, st.Meta.ACP())
	if err != nil {
		return ReadResult{}, err
	}
	return ReadResult{OpKey: x.plan.OpKey, Path: st.Path, Content: content}, nil
}

// WriteTextFile runs write_text_file (empty content is refused: ACP cannot
// carry it).
func (c *Conn) WriteTextFile(ctx context.Context, sessionID string, o CallOptions, path, content string) (WriteResult, error) {
	x, err := c.authorize(ctx, sessionID, o, contract.WriteTool{Path: path, Content: content})
	if err != nil {
		return WriteResult{}, err
	}
	st := x.plan.Step.(contract.WriteStep)
	if err := x.write(ctx, st.Path, st.Content, st.Meta.ACP()); err != nil {
		return WriteResult{}, err
	}
	return WriteResult{OpKey: x.plan.OpKey, Path: st.Path, Bytes: len(st.Content)}, nil
}

// EditTextFile runs edit_text_file: oldText must occur exactly once, and
// the write is refused (precondition_failed) if the file changed after it
// was read, so no update is lost.
func (c *Conn) EditTextFile(ctx context.Context, sessionID string, o CallOptions, path, oldText, newText string) (EditResult, error) {
	x, err := c.authorize(ctx, sessionID, o, contract.EditTool{Path: path, OldText: oldText, NewText: newText})
	if err != nil {
		return EditResult{}, err
	}
	return x.edit(ctx, x.plan.Step.(contract.EditStep))
}

// ListDirectory runs list_directory inside the computer (never host
// metadata).
func (c *Conn) ListDirectory(ctx context.Context, sessionID string, o CallOptions, path string) (ListResult, error) {
	x, err := c.authorize(ctx, sessionID, o, contract.ListTool{Path: path})
	if err != nil {
		return ListResult{}, err
	}
	st := x.plan.Step.(contract.TerminalStep)
	run, err := x.shellRun(ctx, x.terminal(ctx, st))
	if err != nil {
		return ListResult{}, err
	}
	entries, err := toolplan.FinishList(st.Dir, run)
	if err != nil {
		return ListResult{}, err
	}
	out := ListResult{OpKey: x.plan.OpKey, Path: st.Dir}
	for _, e := range entries {
		out.Entries = append(out.Entries, DirEntry{Name: e.Name, Type: e.Type})
	}
	return out, nil
}

// RunCommand runs run_command: past its deadline the command is killed
// (TimedOut). A cancelled command comes back as its result (Cancelled, the
// kill's exit, the output so far, the op key) together with a
// *CancelledError whose Run is that result.
func (c *Conn) RunCommand(ctx context.Context, sessionID string, o CallOptions, cmd Command) (CommandResult, error) {
	t := contract.RunTool{Command: cmd.Command, Args: cmd.Args, Cwd: cmd.Cwd, OutputLimit: cmd.OutputByteLimit, Verify: cmd.Verify}
	for _, e := range cmd.Env {
		t.Env = append(t.Env, acp.EnvVariable{Name: e.Name, Value: e.Value})
	}
	x, err := c.authorize(ctx, sessionID, o, t)
	if err != nil {
		return CommandResult{}, err
	}
	return x.commandResult(ctx, x.terminal(ctx, x.plan.Step.(contract.TerminalStep)))
}

// Glob runs glob: the absolute paths below dir that match pattern ("**"
// matches zero or more segments). The binding is checked again after the
// command: a binding lost in between fails the call (fenced), never a
// partial result.
func (c *Conn) Glob(ctx context.Context, sessionID string, o CallOptions, pattern, dir string) (GlobResult, error) {
	x, err := c.authorize(ctx, sessionID, o, contract.GlobTool{Pattern: pattern, Dir: dir})
	if err != nil {
		return GlobResult{}, err
	}
	st := x.plan.Step.(contract.TerminalStep)
	run, err := x.shellRun(ctx, x.terminal(ctx, st))
	if err != nil {
		return GlobResult{}, err
	}
	matches, err := toolplan.FinishGlob(st.Dir, pattern, run)
	if err == nil {
		err = x.report(ctx, nil, true)
	}
	if err != nil {
		return GlobResult{}, err
	}
	return GlobResult{OpKey: x.plan.OpKey, Matches: matches}, nil
}

// Grep runs grep below dir, with the same check after the command as Glob.
func (c *Conn) Grep(ctx context.Context, sessionID string, o CallOptions, pattern, dir string, g GrepOptions) (GrepResult, error) {
	x, err := c.authorize(ctx, sessionID, o, contract.GrepTool{Pattern: pattern, Dir: dir, Fixed: g.Fixed, IgnoreCase: g.IgnoreCase})
	if err != nil {
		return GrepResult{}, err
	}
	st := x.plan.Step.(contract.TerminalStep)
	run, err := x.shellRun(ctx, x.terminal(ctx, st))
	if err != nil {
		return GrepResult{}, err
	}
	ms, err := toolplan.FinishGrep(st.Dir, run)
	if err == nil {
		err = x.report(ctx, nil, true)
	}
	if err != nil {
		return GrepResult{}, err
	}
	out := GrepResult{OpKey: x.plan.OpKey}
	for _, m := range ms {
		out.Matches = append(out.Matches, GrepMatch{Path: m.Path, Line: m.Line, Text: m.Text})
	}
	return out, nil
}
