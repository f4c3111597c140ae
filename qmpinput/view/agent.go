package view

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/tetherdev/tether/qmpinput"
)

// Agent channel bounds.
const (
	maxAgentScript = 64 << 10
	maxAgentConns  = 4
	agentReadLimit = 30 * time.Second
)

// ServeAgent serves the agent's side of the view on a unix socket: each
// connection sends one script (tether-qmp run's syntax, at most 64 KiB,
// then closes its write side) and reads one JSON line per action back.
// The script runs on the view's own adapter, so a person's take over or
// pause fences it exactly as it fences any agent call. Only processes of
// uid (SO_PEERCRED) are served. It returns when ctx ends or l fails; it
// closes l and waits for the scripts in progress.
func ServeAgent(ctx context.Context, l *net.UnixListener, a *qmpinput.Adapter, uid uint32, perAction time.Duration) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	sem := make(chan struct{}, maxAgentConns)
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case sem <- struct{}{}:
		default:
			agentRefuse(c, fmt.Errorf("%w: %d agent scripts already running", qmpinput.ErrConfig, maxAgentConns))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			serveAgentConn(ctx, c, a, uid, perAction)
		}()
	}
}

func serveAgentConn(ctx context.Context, c *net.UnixConn, a *qmpinput.Adapter, uid uint32, perAction time.Duration) {
	defer c.Close()
	peer, err := qmpinput.PeerUID(c)
	if err == nil && peer != uid {
		err = &qmpinput.OwnerError{What: "agent peer process", Path: "agent socket", Want: uid, Got: peer}
	}
	if err != nil {
		agentRefuse(c, err)
		return
	}
	c.SetReadDeadline(time.Now().Add(agentReadLimit))
	script, err := io.ReadAll(io.LimitReader(c, maxAgentScript+1))
	if err == nil && len(script) > maxAgentScript {
		err = fmt.Errorf("%w: script larger than %d bytes", qmpinput.ErrScript, maxAgentScript)
	}
	if err != nil {
		agentRefuse(c, err)
		return
	}
	actions, err := qmpinput.ParseScript(bytes.NewReader(script))
	if err != nil {
		agentRefuse(c, err)
		return
	}
	qmpinput.RunScript(ctx, a, actions, c, perAction)
}

func agentRefuse(c net.Conn, err error) {
	json.NewEncoder(c).Encode(map[string]any{"ok": false, "code": qmpinput.ErrorCode(err), "error": err.Error()})
	c.Close()
}
