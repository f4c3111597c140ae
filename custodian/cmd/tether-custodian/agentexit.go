package main

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// An agent that dies while the custodian waits for it (initialize, the
// session's bind, a prompt) shows the custodian only a closed pipe ("peer
// disconnected"); its reason is on its own stderr. The custodian keeps the
// last bytes of that stderr and, when a call fails because the agent
// ended, puts its exit status and its last stderr lines into the error.

// stderrTailBytes bounds what is kept of the agent's stderr.
const stderrTailBytes = 4096

// How long a failed call waits for the agent to be seen gone before the
// error is reported without its reason: during start-up (initialize, the
// bind) a failure is most often the agent's death; a prompt's error
// usually comes from a live agent, which should not cost a wait.
var (
	agentExitWait       = 2 * time.Second
	agentExitWaitPrompt = 250 * time.Millisecond
)

// tailWriter keeps the last stderrTailBytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - stderrTailBytes; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// lastLines returns up to n of the last non-empty lines, joined by " | ".
func (t *tailWriter) lastLines(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []string
	for _, l := range bytes.Split(t.buf, []byte("\n")) {
		if s := strings.TrimSpace(string(l)); s != "" {
			lines = append(lines, s)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// watchedAgent is an agentProc whose Wait runs once, on its own
// goroutine, from the start; Wait may then be called any number of times.
type watchedAgent struct {
	agentProc
	done chan struct{}
	err  error // set before done is closed
	tail *tailWriter
}

func watchAgent(p agentProc, tail *tailWriter) *watchedAgent {
	w := &watchedAgent{agentProc: p, done: make(chan struct{}), tail: tail}
	go func() { w.err = p.Wait(); close(w.done) }()
	return w
}

// Wait returns the agent's exit, once it has exited.
func (w *watchedAgent) Wait() error {
	<-w.done
	return w.err
}

// errAgentExited marks a call that failed because the agent ended.
var errAgentExited = errors.New("the agent exited")

// explain adds the agent's exit and its last stderr lines to err, when
// the agent is gone within wait; otherwise it returns err.
func (w *watchedAgent) explain(err error, wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
		return err
	}
	status := "exit status 0"
	if w.err != nil {
		status = w.err.Error()
	}
	last := w.tail.lastLines(3)
	if last == "" {
		return fmt.Errorf("%w (%w: %s; it wrote nothing on stderr)", err, errAgentExited, status)
	}
	return fmt.Errorf("%w (%w: %s; its stderr ended with: %s)", err, errAgentExited, status, last)
}

// resolveAgentArgv makes the agent's command line work from the jail,
// whose working directory is not the caller's: a relative program path
// (one with a slash) becomes absolute, and so does every argument, alone
// or as the value of --flag=VALUE, that names one of the relative
// --jail-exec paths (the agent's plugin, as in `--jail-exec
// bin/tether-plugin -- bin/tether-hostagent --plugin bin/tether-plugin`).
// Other arguments are the agent's and are left as they are.
func resolveAgentArgv(argv, jailExec []string) ([]string, error) {
	out := make([]string, len(argv))
	copy(out, argv)
	if len(out) > 0 && !filepath.IsAbs(out[0]) && strings.Contains(out[0], "/") {
		abs, err := filepath.Abs(out[0])
		if err != nil {
			return nil, fmt.Errorf("agent program %s: %w", out[0], err)
		}
		out[0] = abs
	}
	rel := map[string]string{}
	for _, p := range jailExec {
		if filepath.IsAbs(p) {
			continue
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("--jail-exec %s: %w", p, err)
		}
		rel[filepath.Clean(p)] = abs
	}
	for i := 1; i < len(out); i++ {
		if abs, ok := rel[filepath.Clean(out[i])]; ok && out[i] != "" {
			out[i] = abs
			continue
		}
		if k, v, ok := strings.Cut(out[i], "="); ok && strings.HasPrefix(k, "-") && v != "" {
			if abs, ok := rel[filepath.Clean(v)]; ok {
				out[i] = k + "=" + abs
			}
		}
	}
	return out, nil
}
