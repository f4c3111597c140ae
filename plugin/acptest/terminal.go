package acptest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
)

// terminal is one real child process in its own process group.
type terminal struct {
	cmd   *exec.Cmd
	out   *ringBuffer
	done  chan struct{}
	state *os.ProcessState
}

// ringBuffer keeps the last limit bytes written (ACP truncates from the
// start).
type ringBuffer struct {
	mu        sync.Mutex
	limit     int
	buf       []byte
	truncated bool
}

func (r *ringBuffer) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	if over := len(r.buf) - r.limit; over > 0 {
		r.buf = append([]byte(nil), r.buf[over:]...)
		r.truncated = true
	}
	return len(p), nil
}

func (r *ringBuffer) snapshot() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return string(r.buf), r.truncated
}

// CreateTerminal starts the command in Root (or the given cwd inside it)
// with exactly the requested environment.
func (c *Client) CreateTerminal(ctx context.Context, p acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	if _, err := c.check("terminal/create", p.SessionId, "", p.Meta); err != nil {
		return acp.CreateTerminalResponse{}, err
	}
	if c.OnTerminal != nil {
		c.OnTerminal("terminal/create")
	}
	cwd := c.Root
	if p.Cwd != nil {
		lp, err := c.local(*p.Cwd)
		if err != nil {
			return acp.CreateTerminalResponse{}, acperr.NewError(errcode.CodePathEscape, "%v", err)
		}
		cwd = lp
	}
	limit := 1 << 20
	if p.OutputByteLimit != nil {
		limit = *p.OutputByteLimit
	}
	env := []string{}
	for _, e := range p.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	t := &terminal{out: &ringBuffer{limit: limit}, done: make(chan struct{})}
	t.cmd = exec.Command(p.Command, p.Args...)
	t.cmd.Dir, t.cmd.Env, t.cmd.Stdout, t.cmd.Stderr = cwd, env, t.out, t.out
	t.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := t.cmd.Start(); err != nil {
		return acp.CreateTerminalResponse{}, acperr.NewError(errcode.CodeNotFound, "start %s: %v", p.Command, err)
	}
	go func() {
		_ = t.cmd.Wait()
		t.state = t.cmd.ProcessState
		close(t.done)
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.terminals == nil {
		c.terminals = make(map[string]*terminal)
	}
	c.nextTerm++
	id := fmt.Sprintf("term-%d", c.nextTerm)
	c.terminals[id] = t
	return acp.CreateTerminalResponse{TerminalId: id}, nil
}

func (c *Client) terminal(method string, sid acp.SessionId, id string, meta map[string]any) (*terminal, error) {
	if _, err := c.check(method, sid, "", meta); err != nil {
		return nil, err
	}
	if c.OnTerminal != nil {
		c.OnTerminal(method)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.terminals[id]
	if !ok {
		return nil, acperr.NewError(errcode.CodeNotFound, "terminal %s does not exist", id)
	}
	return t, nil
}

func (t *terminal) exit() *acp.TerminalExitStatus {
	select {
	case <-t.done:
	default:
		return nil
	}
	ws := t.state.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		s := ws.Signal().String()
		return &acp.TerminalExitStatus{Signal: &s}
	}
	code := ws.ExitStatus()
	return &acp.TerminalExitStatus{ExitCode: &code}
}

// TerminalOutput returns the output so far and the exit status if any.
func (c *Client) TerminalOutput(ctx context.Context, p acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	t, err := c.terminal("terminal/output", p.SessionId, p.TerminalId, p.Meta)
	if err != nil {
		return acp.TerminalOutputResponse{}, err
	}
	out, trunc := t.out.snapshot()
	return acp.TerminalOutputResponse{Output: out, Truncated: trunc, ExitStatus: t.exit()}, nil
}

// WaitForTerminalExit blocks until the child exits or the request is
// cancelled.
func (c *Client) WaitForTerminalExit(ctx context.Context, p acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	t, err := c.terminal("terminal/wait_for_exit", p.SessionId, p.TerminalId, p.Meta)
	if err != nil {
		return acp.WaitForTerminalExitResponse{}, err
	}
	if c.OnWait != nil {
		c.OnWait(ctx)
		if ctx.Err() != nil {
			return acp.WaitForTerminalExitResponse{}, errors.New("wait cancelled")
		}
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		return acp.WaitForTerminalExitResponse{}, errors.New("wait cancelled")
	}
	e := t.exit()
	return acp.WaitForTerminalExitResponse{ExitCode: e.ExitCode, Signal: e.Signal}, nil
}

// KillTerminal kills the child's whole process group.
func (c *Client) KillTerminal(ctx context.Context, p acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	t, err := c.terminal("terminal/kill", p.SessionId, p.TerminalId, p.Meta)
	if err != nil {
		return acp.KillTerminalResponse{}, err
	}
	_ = syscall.Kill(-t.cmd.Process.Pid, syscall.SIGKILL)
	<-t.done
	return acp.KillTerminalResponse{}, nil
}

// ReleaseTerminal kills the child if it still runs and forgets it.
func (c *Client) ReleaseTerminal(ctx context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	t, err := c.terminal("terminal/release", p.SessionId, p.TerminalId, p.Meta)
	if err != nil {
		return acp.ReleaseTerminalResponse{}, err
	}
	_ = syscall.Kill(-t.cmd.Process.Pid, syscall.SIGKILL)
	<-t.done
	c.mu.Lock()
	delete(c.terminals, p.TerminalId)
	c.mu.Unlock()
	return acp.ReleaseTerminalResponse{}, nil
}

// Running reports how many terminals are not yet released.
func (c *Client) Running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.terminals)
}
