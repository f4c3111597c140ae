package host

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	pb "github.com/tetherdev/tether/plugin/proto"
	"github.com/tetherdev/tether/plugin/shared"
)

// ErrCancelled is wrapped (through *CancelledError) by every tool call
// whose caller cancelled it and whose clean-up finished: no command of the
// call is still running or unreleased.
var ErrCancelled = shared.ErrCancelled

// ErrCancelUnconfirmed: the caller cancelled a tool call and the plugin did
// not answer within the cancel grace (WithCancelGrace). The host's own part
// of the clean-up (kill, output, release of a running command) has ended
// when this is returned; what the plugin was doing is unknown.
var ErrCancelUnconfirmed = errors.New("plugin did not confirm the cancelled call's clean-up")

// DefaultCancelGrace is how long a cancelled tool call waits for the
// plugin's answer: the longest clean-up a command may need
// (shared.MaxCleanupTimeout) and a margin.
const DefaultCancelGrace = shared.MaxCleanupTimeout + 5*time.Second

// CancelledError is a tool call its caller cancelled, returned once its
// clean-up finished. For run_command, Run is the plugin's result: the
// command was killed (its exit says how it ended), its output so far, the
// op key its receipts carry.
type CancelledError struct {
	Tool  string
	Cause error // the caller's context error or cause
	Run   *pb.RunCommandToolResponse
}

func (e *CancelledError) Error() string {
	if e.Run != nil {
		return fmt.Sprintf("%s cancelled (%v): the command was killed and terminal %s released", e.Tool, e.Cause, e.Run.GetTerminalId())
	}
	return fmt.Sprintf("%s cancelled (%v)", e.Tool, e.Cause)
}

// Is makes errors.Is(err, ErrCancelled) true.
func (e *CancelledError) Is(target error) bool { return target == ErrCancelled }

// Unwrap returns the caller's cause.
func (e *CancelledError) Unwrap() error { return e.Cause }

// toolCall is one tool call in flight: its caller's ctx (done means
// cancelled) and the host-side ACP work running for it.
type toolCall struct {
	caller context.Context

	mu     sync.Mutex
	active int
	over   bool
	idle   chan struct{}
}

// enter records one more piece of host-side work for the call; false
// means the call is over and the work must not start.
func (t *toolCall) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over {
		return false
	}
	t.active++
	return true
}

func (t *toolCall) leave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active--
	if t.active == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// end marks the call over and returns a channel closed once its host-side
// work has finished.
func (t *toolCall) end() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.over = true
	ch := make(chan struct{})
	if t.active == 0 {
		close(ch)
	} else {
		t.idle = ch
	}
	return ch
}

// callTable maps call ids to the tool calls of one connection. Ids only
// need to be unique within the connection (the plugin sees every one
// anyway), so they count up.
type callTable struct {
	mu    sync.Mutex
	next  uint64
	calls map[string]*toolCall
}

func (c *callTable) add(caller context.Context) (string, *toolCall) {
	t := &toolCall{caller: caller}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = make(map[string]*toolCall)
	}
	c.next++
	id := "call-" + strconv.FormatUint(c.next, 10)
	c.calls[id] = t
	return id, t
}

func (c *callTable) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.calls, id)
}

// enter starts host-side work for the call the plugin named. It returns
// the caller's ctx (nil for an unnamed call, which cannot be cancelled)
// and the function that ends the work. A named call that is unknown or
// over is refused with ErrCancelled and nothing may be sent for it.
func (c *callTable) enter(id string) (context.Context, func(), error) {
	if id == "" {
		return nil, func() {}, nil
	}
	c.mu.Lock()
	t, ok := c.calls[id]
	c.mu.Unlock()
	if !ok || !t.enter() {
		return nil, nil, fmt.Errorf("%w: tool call %s is over", ErrCancelled, id)
	}
	return t.caller, t.leave, nil
}

// invoke runs one tool call on the plugin. The call is never abandoned
// when ctx ends: ctx's end tells this connection's AcpClient server to
// refuse the call's new work and to end its running command, and invoke
// waits for the plugin's answer, which comes after that clean-up, then for
// the host-side work to finish. It gives up on the plugin after the cancel
// grace (ErrCancelUnconfirmed).
func invoke[Req, Resp any](c *Conn, ctx context.Context, tool string, tc *pb.ToolContext,
	f func(context.Context, Req) (Resp, error), req Req) (Resp, error) {
	var zero Resp
	if ctx.Err() != nil {
		return zero, &CancelledError{Tool: tool, Cause: context.Cause(ctx)}
	}
	id, call := c.calls.add(ctx)
	defer c.calls.remove(id)
	tc.CallId = id
	rpc, cancelRPC := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelRPC(nil)
	stop := context.AfterFunc(ctx, func() {
		time.AfterFunc(c.p.cancelGrace, func() { cancelRPC(ErrCancelUnconfirmed) })
	})
	defer stop()
	resp, err := f(rpc, req)
	<-call.end()
	if ctx.Err() == nil {
		return resp, err
	}
	switch {
	case errors.Is(context.Cause(rpc), ErrCancelUnconfirmed):
		return zero, fmt.Errorf("%s cancelled (%v): %w within %v", tool, context.Cause(ctx), ErrCancelUnconfirmed, c.p.cancelGrace)
	case errors.Is(err, ErrCancelled):
		return zero, &CancelledError{Tool: tool, Cause: context.Cause(ctx)}
	}
	return resp, err
}
