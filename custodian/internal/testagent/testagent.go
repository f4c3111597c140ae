// Package testagent is a foreign ACP agent for the custodian's tests,
// written with acp-go-sdk and independent of the plugin. Each prompt line
// is a command it carries out through the client's fs/terminal methods,
// reporting each result as an agent message:
//
//	read PATH                 fs/read_text_file
//	write PATH TEXT...        fs/write_text_file
//	exec CMD ARGS...          terminal/create, wait_for_exit, output, release
//	sh SCRIPT...              exec /bin/sh -c SCRIPT (the rest of the line)
//	ask TITLE...              session/request_permission for a tool call
//	                          titled TITLE, offering allow_once,
//	                          allow_always and reject_once
//	meta                      the session/new or session/load _meta it got,
//	                          without tether/bind, as JSON
//	stop REASON               end the turn with that stop reason
//	fetch URL                 the agent's own HTTP GET (not through
//	                          ACP), through $HTTP_PROXY when set, even
//	                          to a loopback URL: "ok fetch STATUS BODY"
//
// With $TEST_AGENT_PLAIN set it is a plain agent, as claude-code-acp is:
// it never attaches and sends no `_meta["tether/op"]` (unless wrongtuple
// asks for a wrong one), and its exec sends what such agents send: a bare
// name with args and no env and no cwd; sh sends the whole line as command
// with no args.
//
// A line may start with modifiers: key=K (op key base, for retries),
// nometa (no `_meta["tether/op"]`), wrongtuple (another tuple's digest),
// verify=PATH:SHA256 (exec: `_meta["tether/verify"]` for that file),
// session=ID (another session id). Results read "ok ..." or
// "error CODE ...", where CODE is the tether code of the refusal. The
// word ROOT in a line stands for the bound tuple's root.
package testagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	neturl "net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
)

// Agent is the scripted agent.
type Agent struct {
	acp.Agent // nil: methods not defined here are never expected
	conn      *acp.AgentSideConnection
	sessionID string

	plain     bool
	mu        sync.Mutex
	digest    map[string]string // session -> tuple digest from its bind
	root      map[string]string
	extraMeta map[string]string // session -> its session/new _meta without tether/bind, as JSON
}

// Main serves the agent on stdin/stdout until stdin closes. The session id
// it answers is $TEST_AGENT_SESSION, default "sess-1"; $TEST_AGENT_PLAIN
// makes it a plain agent.
//
// With $TEST_AGENT_IGNORE_EOF set it behaves as claude-code-acp does at
// the end of its input: it keeps running until SIGTERM, then prints
// "test-agent: ended on SIGTERM" on stderr and exits 0.
func Main() {
	ignoreEOF := os.Getenv("TEST_AGENT_IGNORE_EOF") != ""
	term := make(chan os.Signal, 1)
	if ignoreEOF {
		signal.Notify(term, syscall.SIGTERM)
	}
	a := serve(os.Stdout, os.Stdin, os.Getenv("TEST_AGENT_SESSION"), os.Getenv("TEST_AGENT_PLAIN") != "")
	<-a.conn.Done()
	if ignoreEOF {
		<-term
		fmt.Fprintln(os.Stderr, "test-agent: ended on SIGTERM")
	}
}

// Serve runs the agent (a tether agent) on the given streams.
func Serve(w io.Writer, r io.Reader, sessionID string) *Agent { return serve(w, r, sessionID, false) }

func serve(w io.Writer, r io.Reader, sessionID string, plain bool) *Agent {
	if sessionID == "" {
		sessionID = "sess-1"
	}
	a := &Agent{sessionID: sessionID, plain: plain, digest: map[string]string{}, root: map[string]string{}, extraMeta: map[string]string{}}
	g := &Gate{R: r, Ready: make(chan struct{})}
	a.conn = acp.NewAgentSideConnection(a, w, g)
	a.conn.SetLogger(slog.New(slog.DiscardHandler))
	close(g.Ready)
	return a
}

// Initialize answers with session loading supported. With
// $TEST_AGENT_HOLD_INIT naming a file, it first prints "test-agent:
// initialize held" on stderr and answers only once that file exists (a
// test's hook to act between the custodian's start and its bind), or
// fails after holdInitMax.
func (a *Agent) Initialize(ctx context.Context, _ acp.InitializeRequest) (acp.InitializeResponse, error) {
	if gate := os.Getenv("TEST_AGENT_HOLD_INIT"); gate != "" {
		if err := holdUntil(ctx, gate); err != nil {
			return acp.InitializeResponse{}, err
		}
	}
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber,
		AgentCapabilities: acp.AgentCapabilities{LoadSession: true}}, nil
}

// holdInitMax bounds how long Initialize holds for its gate file.
const holdInitMax = 2 * time.Minute

// holdUntil waits until path exists, polling every 10 ms.
func holdUntil(ctx context.Context, path string) error {
	fmt.Fprintf(os.Stderr, "test-agent: initialize held until %s exists\n", path)
	deadline := time.Now().Add(holdInitMax)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("test-agent: %s did not appear within %s", path, holdInitMax)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// NewSession binds if asked and attaches, like the plugin does.
func (a *Agent) NewSession(ctx context.Context, req acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	return acp.NewSessionResponse{SessionId: acp.SessionId(a.sessionID)}, a.bind(ctx, a.sessionID, req.Cwd, req.Meta)
}

// LoadSession binds if asked and attaches.
func (a *Agent) LoadSession(ctx context.Context, req acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	return acp.LoadSessionResponse{}, a.bind(ctx, string(req.SessionId), req.Cwd, req.Meta)
}

func (a *Agent) bind(ctx context.Context, sid, cwd string, meta map[string]any) error {
	extra := maps.Clone(meta)
	delete(extra, acpmeta.KeyBind)
	data, _ := json.Marshal(extra)
	a.mu.Lock()
	a.extraMeta[sid] = string(data)
	a.mu.Unlock()
	if a.plain { // knows nothing of tether: its cwd is all it has
		a.mu.Lock()
		a.root[sid] = cwd
		a.mu.Unlock()
		return nil
	}
	b, ok, err := acpmeta.BindFromMeta(meta)
	if !ok || err != nil {
		return err
	}
	a.mu.Lock()
	a.digest[sid], a.root[sid] = b.Tuple.SHA256(), b.Tuple.Root
	a.mu.Unlock()
	_, err = a.conn.CallExtension(ctx, acpmeta.MethodAttach, acpmeta.AttachRequest{SessionID: sid, TupleSHA256: b.Tuple.SHA256()})
	return err
}

// Cancel is accepted and ignored.
func (a *Agent) Cancel(context.Context, acp.CancelNotification) error { return nil }

// Prompt runs each line of the prompt's text.
func (a *Agent) Prompt(ctx context.Context, req acp.PromptRequest) (acp.PromptResponse, error) {
	var text strings.Builder
	for _, b := range req.Prompt {
		if b.Text != nil {
			text.WriteString(b.Text.Text)
			text.WriteByte('\n')
		}
	}
	for _, line := range strings.Split(text.String(), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "stop" {
			return acp.PromptResponse{StopReason: acp.StopReason(f[1])}, nil
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		msg := a.do(ctx, string(req.SessionId), line)
		if err := a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: req.SessionId,
			Update: acp.UpdateAgentMessageText(msg)}); err != nil {
			return acp.PromptResponse{}, err
		}
	}
	return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
}

// call is one command line with its modifiers applied.
type call struct {
	a    *Agent
	sid  acp.SessionId
	key  string
	meta func(step string) map[string]any
	// verify is the files an exec asks to verify (verify= modifiers).
	verify map[string]string
}

func (a *Agent) do(ctx context.Context, sid, line string) string {
	if root := a.rootOf(sid); root != "" {
		line = strings.ReplaceAll(line, "ROOT", root)
	}
	f := strings.Fields(line)
	c := call{a: a, sid: acp.SessionId(sid), key: fresh()}
	digest := a.digestOf(sid)
	mode := ""
	for len(f) > 0 && (strings.HasPrefix(f[0], "key=") || strings.HasPrefix(f[0], "session=") || f[0] == "nometa" || f[0] == "wrongtuple" || strings.HasPrefix(f[0], "verify=")) {
		switch {
		case strings.HasPrefix(f[0], "verify="):
			p, d, _ := strings.Cut(strings.TrimPrefix(f[0], "verify="), ":")
			if c.verify == nil {
				c.verify = map[string]string{}
			}
			c.verify[p] = d
		case strings.HasPrefix(f[0], "key="):
			c.key = strings.TrimPrefix(f[0], "key=")
		case strings.HasPrefix(f[0], "session="):
			c.sid = acp.SessionId(strings.TrimPrefix(f[0], "session="))
		default:
			mode = f[0]
		}
		f = f[1:]
	}
	if mode == "wrongtuple" {
		digest = strings.Repeat("0", 64)
	}
	c.meta = func(step string) map[string]any {
		if mode == "nometa" || a.plain && mode == "" {
			return nil
		}
		return acpmeta.Op{TupleSHA256: digest, OpKey: c.key + ":" + step, Deadline: time.Now().Add(time.Minute)}.Meta()
	}
	if len(f) == 0 {
		return "error invalid empty command"
	}
	return c.run(ctx, f[0], f[1:])
}

func (c call) run(ctx context.Context, cmd string, args []string) string {
	switch {
	case cmd == "read" && len(args) == 1:
		r, err := c.a.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: c.sid, Path: args[0], Meta: c.meta("read")})
		return result(err, "ok read %q", r.Content)
	case cmd == "write" && len(args) >= 2:
		_, err := c.a.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: c.sid, Path: args[0],
			Content: strings.Join(args[1:], " ") + "\n", Meta: c.meta("write")})
		return result(err, "ok write %s", args[0])
	case cmd == "exec" && len(args) >= 1:
		return c.exec(ctx, args)
	case cmd == "fetch" && len(args) == 1:
		return fetch(ctx, args[0])
	case cmd == "sh" && len(args) >= 1 && c.a.plain:
		return c.exec(ctx, []string{strings.Join(args, " ")})
	case cmd == "sh" && len(args) >= 1:
		return c.exec(ctx, []string{"/bin/sh", "-c", strings.Join(args, " ")})
	case cmd == "ask" && len(args) >= 1:
		return c.ask(ctx, strings.Join(args, " "))
	case cmd == "env" && len(args) == 1:
		v, ok := os.LookupEnv(args[0])
		if !ok {
			return "ok env " + args[0] + " unset"
		}
		return "ok env " + args[0] + "=" + v
	case cmd == "flagfile" && len(args) == 1:
		return flagFile(args[0])
	case cmd == "meta" && len(args) == 0:
		c.a.mu.Lock()
		defer c.a.mu.Unlock()
		return "ok meta " + c.a.extraMeta[string(c.sid)]
	}
	return fmt.Sprintf("error invalid unknown command %q", cmd)
}

// flagFile reports the file named after flag on the agent's command line:
// its path, mode and first line (what an agent profile wrote for it).
func flagFile(flag string) string {
	i := slices.Index(os.Args, flag)
	if i < 0 || i+1 >= len(os.Args) {
		return "error invalid no " + flag + " on the command line"
	}
	path := os.Args[i+1]
	fi, err := os.Stat(path)
	if err != nil {
		return result(err, "")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return result(err, "")
	}
	first, _, _ := strings.Cut(string(data), "\n")
	return fmt.Sprintf("ok flagfile %s mode=%#o first=%s", path, fi.Mode().Perm(), first)
}

// ask requests permission for a tool call titled title.
func (c call) ask(ctx context.Context, title string) string {
	resp, err := c.a.conn.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: c.sid,
		ToolCall: acp.ToolCallUpdate{ToolCallId: acp.ToolCallId(c.key), Title: &title},
		Options: []acp.PermissionOption{{OptionId: "o1", Name: "Allow once", Kind: acp.PermissionOptionKindAllowOnce},
			{OptionId: "o2", Name: "Always", Kind: acp.PermissionOptionKindAllowAlways},
			{OptionId: "o3", Name: "Reject", Kind: acp.PermissionOptionKindRejectOnce}}})
	if err != nil {
		return result(err, "")
	}
	if resp.Outcome.Selected == nil {
		return "ok ask cancelled"
	}
	return "ok ask " + string(resp.Outcome.Selected.OptionId)
}

// createRequest is the terminal/create a tether agent sends (absolute
// cwd, an explicit PATH) or, plain, what ACP agents send (no cwd, no env).
func (c call) createRequest(argv []string) acp.CreateTerminalRequest {
	req := acp.CreateTerminalRequest{SessionId: c.sid, Command: argv[0], Args: argv[1:], Meta: c.meta("create")}
	if c.verify != nil {
		req.Meta = acpmeta.MergeMeta(req.Meta, acpmeta.Verify{Files: c.verify}.Meta())
	}
	if c.a.plain {
		return req
	}
	if cwd := c.a.rootOf(string(c.sid)); cwd != "" {
		req.Cwd = &cwd
	}
	req.Env = []acp.EnvVariable{{Name: "PATH", Value: "/usr/local/bin:/usr/bin:/bin"}}
	return req
}

func (c call) exec(ctx context.Context, argv []string) string {
	t, err := c.a.conn.CreateTerminal(ctx, c.createRequest(argv))
	if err != nil {
		return result(err, "")
	}
	w, err := c.a.conn.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: c.sid, TerminalId: t.TerminalId, Meta: c.meta("wait")})
	if err != nil {
		return result(err, "")
	}
	out, err := c.a.conn.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: c.sid, TerminalId: t.TerminalId, Meta: c.meta("output")})
	if err != nil {
		return result(err, "")
	}
	_, err = c.a.conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: c.sid, TerminalId: t.TerminalId, Meta: c.meta("release")})
	code := -1
	if w.ExitCode != nil {
		code = *w.ExitCode
	}
	return result(err, "ok exec exit=%d output=%q", code, out.Output)
}

func result(err error, format string, args ...any) string {
	if err != nil {
		if code, ok := acperr.CodeOf(err); ok {
			return fmt.Sprintf("error %s %v", code, err)
		}
		return fmt.Sprintf("error uncoded %v", err)
	}
	return fmt.Sprintf(format, args...)
}

func (a *Agent) digestOf(sid string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if d, ok := a.digest[sid]; ok {
		return d
	}
	for _, d := range a.digest { // a foreign session borrows a real digest
		return d
	}
	return strings.Repeat("f", 64)
}

func (a *Agent) rootOf(sid string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.root[sid]
}

func fresh() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "ta-" + hex.EncodeToString(b[:])
}

// Gate holds reads from R until Ready is closed, so an SDK connection
// built on it handles nothing before its constructor's result (and logger)
// is stored: acp-go-sdk starts reading inside the constructor.
type Gate struct {
	R     io.Reader
	Ready chan struct{}
}

// Read waits for Ready, then reads from R.
func (g *Gate) Read(p []byte) (int, error) {
	<-g.Ready
	return g.R.Read(p)
}

// fetch GETs url as an agent calling its model would, through
// $HTTP_PROXY when it is set (net/http's ProxyFromEnvironment would
// never proxy a loopback URL, which a model server in a test is).
func fetch(ctx context.Context, url string) string {
	tr := &http.Transport{DisableKeepAlives: true}
	if p := os.Getenv("HTTP_PROXY"); p != "" {
		u, err := neturl.Parse(p)
		if err != nil {
			return fmt.Sprintf("error proxy %q: %v", p, err)
		}
		tr.Proxy = http.ProxyURL(u)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "error fetch " + err.Error()
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "error fetch " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return fmt.Sprintf("ok fetch %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
}
