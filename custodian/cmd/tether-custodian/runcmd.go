package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/agentprofile"
	"github.com/tetherdev/tether/custodian/credfile"
)

// prompts collects repeated --prompt flags.
type prompts []string

// String and Set make prompts a repeatable flag.
func (p *prompts) String() string     { return strings.Join(*p, "\n") }
func (p *prompts) Set(s string) error { *p = append(*p, s); return nil }

// How the agent is ended after the last prompt: its stdin is closed and
// it gets agentEOFGrace to exit; then it is asked to end (SIGTERM to it
// and what it started) and gets agentStopGrace; then it is killed.
// Agents that exit at the end of their input (Gemini CLI, the plugin's
// host agents) never see a signal; claude-code-acp does not notice the
// end of its input and ends on SIGTERM at once, instead of costing
// every run a whole kill grace.
var (
	agentEOFGrace  = time.Second
	agentStopGrace = 5 * time.Second
)

func cmdRun(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config file (JSON, see docs/custodian.md); required unless --computer-socket")
	sessionID := fs.String("session-id", "", "session/load this session instead of session/new")
	agent := fs.String("agent", "", "a profile: claude-code, gemini, plain (any agent that knows nothing of tether) or tether (the strict protocol, the default); overrides the config's agent; \"tether-custodian agents\" lists what each sets")
	standby := fs.Bool("standby", false, "wait until no live custodian owns --session-id, take it over (its keys left in flight become interrupted), then run; needs an etcd op_store")
	var ps prompts
	fs.Var(&ps, "prompt", "prompt text; repeat for several (default: one prompt per stdin line, each sent as it arrives)")
	jf := addJailFlags(fs)
	cf := addComputerFlags(fs)
	usageFor(fs, "run --config FILE|--computer-socket SOCK [--keep-computer] [--agent claude-code|gemini|plain|tether] [--session-id ID [--standby]] [--prompt TEXT]... [--no-jail] [--jail-read PATH]... [--jail-exec PATH]... -- AGENT_CMD [ARGS...]",
		"Spawns the ACP agent over stdio, initializes with the fs and terminal capabilities,\n"+
			"binds a session to the config's tuple (session/new, or session/load with --session-id),\n"+
			"sends the prompts and writes every session update to stdout as one JSON line, in order.\n"+
			"Exits 0 only if every prompt ended with end_turn and no permission was refused in it;\n"+
			"stops at the first that did not.")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if (*cfgPath == "") == (cf.socket == "") || fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	var profile *agentprofile.Profile
	if *agent != "" {
		var err error
		if profile, err = agentprofile.Lookup(*agent); err != nil {
			return fail(stderr, exitUsage, "run: --agent: %v", err)
		}
	}
	if cf.socket != "" {
		path, release, err := cf.acquire(ctx, stderr)
		defer release()
		if err != nil {
			return fail(stderr, exitRuntime, "run: %v", err)
		}
		*cfgPath = path
	}
	cfg, err := custodian.LoadConfig(*cfgPath)
	if err != nil {
		return fail(stderr, exitUsage, "run: %v", err)
	}
	if profile != nil {
		if err := profile.ApplyConfig(cfg); err != nil {
			return fail(stderr, exitUsage, "run: --agent %s: %v", *agent, err)
		}
	}
	if *standby && (*sessionID == "" || !cfg.OpStore.Etcd()) {
		return fail(stderr, exitUsage, "run: --standby needs --session-id and an op_store of kind etcd")
	}
	argv, err := resolveAgentArgv(fs.Args(), jf.exec)
	if err != nil {
		return fail(stderr, exitUsage, "run: %v", err)
	}
	r := &runner{cfg: cfg, sessionID: *sessionID, standby: *standby, next: flagPrompts(ps), argv: argv, stdout: stdout, stderr: &syncWriter{w: stderr}}
	r.jail, r.configPath, r.env, r.profile = jf, *cfgPath, os.Environ(), profile
	if profile != nil {
		cleanup, err := r.applyProfile(profile)
		defer cleanup()
		if err != nil {
			return fail(stderr, exitRuntime, "run: %v", err)
		}
	}
	if len(ps) == 0 {
		if stdin == nil {
			return fail(stderr, exitUsage, "run: no prompt: give --prompt TEXT, or prompt lines on stdin")
		}
		r.fromStdin = true
		lr := readLines(stdin)
		defer lr.stop()
		r.next = lr.next
	}
	return r.run(ctx)
}

// takeOver waits until the session's owner is gone and claims it; the
// agent starts only then, and binds the session with session/load.
func (r *runner) takeOver(ctx context.Context, c *custodian.Custodian) int {
	fmt.Fprintf(r.stderr, "tether-custodian: standby for session %s: waiting until its owner's lease ends\n", r.sessionID)
	cl, err := c.TakeOver(ctx, r.sessionID)
	if err != nil {
		return fail(r.stderr, exitRuntime, "run: take session %s over: %v", r.sessionID, err)
	}
	fmt.Fprintf(r.stderr, "tether-custodian: took session %s over (fencing token %d; %d op keys left in flight now interrupted)\n",
		r.sessionID, cl.Token, len(cl.Interrupted))
	return exitOK
}

// nextPrompt returns the next prompt to send, false when there is none
// left, or why it could not read one.
type nextPrompt func(ctx context.Context) (string, bool, error)

// flagPrompts yields the --prompt flags in order.
func flagPrompts(ps []string) nextPrompt {
	return func(context.Context) (string, bool, error) {
		if len(ps) == 0 {
			return "", false, nil
		}
		p := ps[0]
		ps = ps[1:]
		return p, true, nil
	}
}

// lineReader yields the non-empty lines of stdin as they arrive, so each
// prompt is sent as soon as its line is complete, not at EOF.
type lineReader struct {
	lines chan string
	done  chan struct{}
	err   error // set before lines is closed
}

// readLines starts reading r on its own goroutine. It ends at EOF, at a
// read error or at stop; a read blocked on a stdin that never ends holds
// it until the process exits, which follows run's return.
func readLines(r io.Reader) *lineReader {
	lr := &lineReader{lines: make(chan string), done: make(chan struct{})}
	go func() {
		defer close(lr.lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			select {
			case lr.lines <- line:
			case <-lr.done:
				return
			}
		}
		lr.err = sc.Err()
	}()
	return lr
}

// next waits for the next line, EOF (false) or ctx.
func (lr *lineReader) next(ctx context.Context) (string, bool, error) {
	select {
	case <-ctx.Done():
		return "", false, ctx.Err()
	case line, ok := <-lr.lines:
		if !ok {
			return "", false, lr.err
		}
		return line, true, nil
	}
}

// stop ends the reader's wait to hand over a line. Call it once.
func (lr *lineReader) stop() { close(lr.done) }

// runner is one `tether-custodian run`.
type runner struct {
	cfg       *custodian.Config
	sessionID string
	standby   bool // take sessionID over (fleet.go) before the agent starts
	next      nextPrompt
	argv      []string
	env       []string // the agent's environment (before the jail's changes)
	stdout    io.Writer
	stderr    io.Writer
	outMu     sync.Mutex
	perms     refusals
	fromStdin bool          // prompts are stdin's lines (no --prompt)
	agent     *watchedAgent // set by withAgent once the agent started
	// jail and configPath are set by cmdRun; jail.go starts the agent.
	jail       *jailFlags
	configPath string
	// profile is --agent's profile (nil without it): its endpoint
	// settles the jail's network (agentnet.go).
	profile *agentprofile.Profile
}

func (r *runner) run(ctx context.Context) int {
	// Warnings and errors only; the library routes acp-go-sdk's
	// diagnostics through this logger too, its routine ones at Debug.
	log := slog.New(slog.NewTextHandler(r.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	key, err := credfile.Read(r.cfg.AuditKeyFile)
	if err != nil {
		return fail(r.stderr, exitRuntime, "run: audit key: %v", err)
	}
	dial, err := custodian.ReceiverDialer(r.cfg.Receiver)
	if err != nil {
		return fail(r.stderr, exitRuntime, "run: receiver: %v", err)
	}
	if r.cfg.Computer != nil {
		dial = wakingDialer(dial, newWaker(r.cfg.Computer, r.stderr))
	}
	witnesses, err := r.witnessOptions()
	if err != nil {
		return fail(r.stderr, exitUsage, "run: %v", err)
	}
	fleet, err := r.openFleet(ctx)
	if err != nil {
		return fail(r.stderr, exitRuntime, "run: op_store: %v", err)
	}
	opts := custodian.Options{StateDir: r.cfg.StateDir, AuditKey: key, Logger: log,
		Retention: time.Duration(r.cfg.Retention), CommandBudget: time.Duration(r.cfg.CommandBudget),
		RefusalBudget: r.cfg.RefusalBudget, AuditBudget: r.cfg.AuditBudget, LongLines: r.cfg.LongLines,
		LongLineBytes: r.cfg.LongLineBytes, Witness: witnesses}
	if fleet != nil {
		opts.Fleet, opts.StoreWait = fleet.Store, r.cfg.OpStore.UnavailableWait()
	}
	c, err := custodian.New(opts)
	if err != nil {
		closeFleet(fleet)
		return fail(r.stderr, exitRuntime, "run: %v", err)
	}
	recv := custodian.NewReceiver(dial, custodian.Backoff{}, log)
	code := r.withFleet(ctx, fleet, func(ctx context.Context) int { return r.withAgent(ctx, c, recv) })
	recv.Close()
	if err := errors.Join(c.Close(), closeFleet(fleet)); err != nil {
		fmt.Fprintf(r.stderr, "tether-custodian: closing state: %v\n", err)
		if code == exitOK {
			code = exitRuntime
		}
	}
	return code
}

// openFleet opens the etcd op store when the config names one.
func (r *runner) openFleet(ctx context.Context) (*custodian.Fleet, error) {
	if !r.cfg.OpStore.Etcd() {
		return nil, nil
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return custodian.OpenFleet(octx, *r.cfg.OpStore, time.Duration(r.cfg.Retention))
}

// closeFleet revokes the ownership lease, so a standby may take the
// session over at once.
func closeFleet(f *custodian.Fleet) error {
	if f == nil {
		return nil
	}
	return f.Close()
}

// errLeaseLost ends a run whose ownership lease in etcd ended: another
// custodian may own its session now, and everything it would send is
// refused (by etcd and by the receiver).
var errLeaseLost = errors.New("the ownership lease in etcd was lost (this custodian was cut off or frozen longer than lease_ttl_s); another custodian may own the session now")

// withFleet runs body with a context that ends when the fleet's
// ownership lease is lost; a standby first takes the session over.
func (r *runner) withFleet(ctx context.Context, fleet *custodian.Fleet, body func(context.Context) int) int {
	if fleet == nil {
		return body(ctx)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-fleet.Store.Lost():
			cancel(errLeaseLost)
		case <-ctx.Done():
		}
	}()
	code := body(ctx)
	if errors.Is(context.Cause(ctx), errLeaseLost) {
		return fail(r.stderr, exitFailed, "run: %v", errLeaseLost)
	}
	return code
}

// withAgent spawns the agent, serves its connection and drives the session.
func (r *runner) withAgent(ctx context.Context, c *custodian.Custodian, recv *custodian.Receiver) int {
	if r.standby {
		if code := r.takeOver(ctx, c); code != exitOK {
			return code
		}
	}
	tail := &tailWriter{}
	toAgent, fromAgent, proc, err := r.startAgent(c, io.MultiWriter(r.stderr, tail))
	if err != nil {
		return fail(r.stderr, exitRuntime, "run: start agent: %v", err)
	}
	cmd := watchAgent(proc, tail)
	r.agent = cmd
	conn := c.Serve(toAgent, fromAgent, custodian.ConnOptions{OnUpdate: r.printUpdate, Permission: r.permission()})
	code := r.session(ctx, conn, recv)
	conn.Close()
	toAgent.Close()
	if err := stopAgent(cmd); err != nil && code == exitOK {
		fmt.Fprintf(r.stderr, "tether-custodian: agent: %v\n", err)
	}
	return code
}

// session initializes, binds and sends every prompt.
func (r *runner) session(ctx context.Context, conn *custodian.Conn, recv *custodian.Receiver) int {
	if _, err := conn.Initialize(ctx); err != nil {
		return fail(r.stderr, exitFailed, "run: initialize: %v", r.agent.explain(err, agentExitWait))
	}
	b := custodian.Binding{Tuple: r.cfg.Tuple, LeaseNotAfter: r.cfg.LeaseNotAfter, Principal: r.cfg.Principal, Receiver: recv,
		Plain: r.cfg.Agent == custodian.AgentPlain}
	sid, err := r.bind(ctx, conn, b)
	if err != nil {
		return fail(r.stderr, exitFailed, "run: bind: %v", r.agent.explain(err, agentExitWait))
	}
	defer r.serveRoutines(ctx, conn)() // `routine run` requests (routine.go)
	for i := 0; ; i++ {
		text, ok, err := r.next(ctx)
		if err != nil {
			code := exitUsage // an unreadable stdin, as before anything ran
			if ctx.Err() != nil {
				code = exitFailed
			}
			return fail(r.stderr, code, "run: read prompt %d from stdin: %v", i+1, err)
		}
		if !ok && i == 0 && r.fromStdin {
			return fail(r.stderr, exitUsage, "run: no prompt: stdin ended before its first line and no --prompt was given; nothing was sent")
		}
		if !ok {
			return exitOK
		}
		resp, err := r.prompt(ctx, conn, acp.PromptRequest{SessionId: sid, Prompt: []acp.ContentBlock{acp.TextBlock(text)}})
		if err != nil {
			return fail(r.stderr, exitFailed, "run: prompt %d: %v", i+1, r.agent.explain(err, agentExitWaitPrompt))
		}
		if resp.StopReason == acp.StopReasonCancelled && ctx.Err() != nil {
			return fail(r.stderr, exitFailed, "run: prompt %d cancelled on interrupt (session/cancel sent; the agent ended the turn)", i+1)
		}
		if resp.StopReason != acp.StopReasonEndTurn {
			return fail(r.stderr, exitFailed, "run: prompt %d ended with %s, not end_turn", i+1, resp.StopReason)
		}
		if refused := r.perms.take(); len(refused) > 0 {
			return fail(r.stderr, exitFailed, "run: prompt %d ended with end_turn, but permission was refused for %s: that work was not done (config permission %q)",
				i+1, strings.Join(refused, "; "), r.cfg.Permission)
		}
	}
}

// cancelGrace bounds how long an interrupted run waits for the agent to
// end a cancelled turn (its commands killed and released through the
// custodian) before it gives up on the answer.
const cancelGrace = 10 * time.Second

// prompt sends one prompt and returns its answer. When ctx ends (SIGINT or
// SIGTERM) while the turn runs, it cancels the turn the ACP way
// (session/cancel), so the agent stops its tools and ends the turn with
// stop reason cancelled, and waits at most cancelGrace for that answer;
// only then does it abandon the request.
func (r *runner) prompt(ctx context.Context, conn *custodian.Conn, req acp.PromptRequest) (acp.PromptResponse, error) {
	pctx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	type answer struct {
		resp acp.PromptResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := conn.Prompt(pctx, req)
		done <- answer{resp, err}
	}()
	select {
	case a := <-done:
		return a.resp, a.err
	case <-ctx.Done():
	}
	grace, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelGrace)
	defer cancel()
	if err := conn.Agent().Cancel(grace, acp.CancelNotification{SessionId: req.SessionId}); err != nil {
		fmt.Fprintf(r.stderr, "run: send session/cancel: %v\n", err)
	}
	select {
	case a := <-done:
		return a.resp, a.err
	case <-grace.Done():
		abandon()
		a := <-done
		return a.resp, fmt.Errorf("interrupted; the agent did not end the cancelled turn within %v: %w", cancelGrace, errors.Join(a.err, grace.Err()))
	}
}

func (r *runner) bind(ctx context.Context, conn *custodian.Conn, b custodian.Binding) (acp.SessionId, error) {
	mcp := []acp.McpServer{}
	if r.sessionID != "" {
		_, err := conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: acp.SessionId(r.sessionID),
			Cwd: r.cfg.Tuple.Root, McpServers: mcp, Meta: maps.Clone(r.cfg.SessionMeta)}, b)
		return acp.SessionId(r.sessionID), err
	}
	resp, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: r.cfg.Tuple.Root, McpServers: mcp, Meta: maps.Clone(r.cfg.SessionMeta)}, b)
	return resp.SessionId, err
}

// printUpdate writes one session/update as a JSON line.
func (r *runner) printUpdate(_ context.Context, n acp.SessionNotification) error {
	data, err := json.Marshal(n)
	if err != nil {
		return err
	}
	r.outMu.Lock()
	defer r.outMu.Unlock()
	_, err = fmt.Fprintf(r.stdout, "%s\n", data)
	return err
}

// permission answers permission requests with the config's policy (the
// library records every answer in the audit log) and remembers the
// refused ones, so a turn that ends with end_turn after a refusal does
// not pass as done.
func (r *runner) permission() func(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	policy := custodian.PermissionPolicy(r.cfg.Permission)
	return func(ctx context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		resp, err := policy(ctx, req)
		if answer := custodian.PermissionAnswer(req, resp); err != nil || !custodian.Granted(answer) {
			r.perms.add(fmt.Sprintf("%s (tool call %s, answered %s)", toolTitle(req.ToolCall), req.ToolCall.ToolCallId, answer))
		}
		return resp, err
	}
}

// toolTitle names a tool call in a refusal message.
func toolTitle(tc acp.ToolCallUpdate) string {
	if tc.Title != nil && *tc.Title != "" {
		return fmt.Sprintf("%q", *tc.Title)
	}
	return "an untitled tool call"
}

// refusals collects the permission requests refused during a turn.
type refusals struct {
	mu   sync.Mutex
	list []string
}

func (f *refusals) add(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, s)
}

// take returns the refusals so far and forgets them.
func (f *refusals) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.list
	f.list = nil
	return out
}

// stopAgent ends the agent after its stdin closed: it waits
// agentEOFGrace for the agent to exit, then sends SIGTERM, then kills it
// after agentStopGrace. An agent that ends on the SIGTERM is not an
// error (its exit status says only that it was asked to end), but a jail
// that fails to clean up after it is.
func stopAgent(cmd agentProc) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(agentEOFGrace):
	}
	termErr := cmd.Terminate()
	select {
	case err := <-done:
		return askedToEnd(err)
	case <-time.After(agentStopGrace):
		cmd.Kill()
		<-done
		return errors.Join(fmt.Errorf("did not exit %v after its stdin closed, nor %v after SIGTERM; killed", agentEOFGrace, agentStopGrace), termErr)
	}
}
