// Package agentprofile holds the agent profiles of `tether-custodian run
// --agent NAME`: for each plain agent tether is tested with, the session
// options, tool denials, policy file and environment that keep the
// agent's own host tools out of play (docs/agents.md "Profiles"). A
// profile is data; the cmd applies it.
package agentprofile

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tetherdev/tether/custodian"
)

// Profile is what `--agent NAME` sets.
type Profile struct {
	// Name is the --agent value.
	Name string
	// Kind is the custodian's agent kind (custodian.AgentPlain or
	// custodian.AgentTether).
	Kind string
	// About says in one line what the profile is for.
	About string
	// Package is the npm package whose package.json, found above the
	// agent's entry point, names the installed version; "" for none.
	Package string
	// Tested are the package versions the end-to-end tests ran
	// (fixtures/agents/e2e); another version gets a warning.
	Tested []string
	// JailRead says which host tree above the entry point the jail shows
	// the agent: "package" (the package's directory) or "node_modules"
	// (the node_modules directory holding it, for its dependencies).
	JailRead string
	// Permission answers the agent's permission requests when the config
	// sets none: every tool the agent keeps acts on the computer through
	// the custodian, so its prompts are answered there.
	Permission string
	// SessionMeta is merged into the session's _meta; a config whose
	// session_meta sets one of its keys is refused.
	SessionMeta map[string]any
	// DeniedTools are the agent's own host tools the profile removes.
	DeniedTools []string
	// Policy, when set, is written by the custodian, shown read-only in
	// the jail, and named on the agent's command line.
	Policy *Policy
	// SetEnv and UnsetEnv adjust the agent's environment.
	SetEnv   []string // NAME=VALUE
	UnsetEnv []string
	// Endpoint is the model endpoint the agent calls, when the profile
	// knows it: the jail then defaults to jail.network "proxy" with an
	// egress policy that allows that endpoint alone.
	Endpoint *Endpoint
}

// Endpoint is where an agent's model is: the base URL in Env when the
// agent's environment sets it, else Host on port 443.
type Endpoint struct {
	Env, Host string
}

// Policy is a file the agent reads its rules from.
type Policy struct {
	// FileName is the file's base name; Flag the agent's option that
	// takes its path.
	FileName, Flag string
	// Content is the whole file.
	Content string
}

// ClaudeCodeHostTools are the Claude Code tools that act on the agent's
// own host instead of going through ACP, once claude-code-acp routes
// Read, Write, Edit and Bash to fs/* and terminal/*: Glob and Grep run
// ripgrep on the host, Task starts a sub-agent with the same host tools,
// NotebookEdit writes host files, WebFetch and WebSearch reach the
// network, Skill and ToolSearch load host files, TaskOutput and TaskStop
// drive Task's background work.
var ClaudeCodeHostTools = []string{"Glob", "Grep", "Task", "TaskOutput", "TaskStop", "NotebookEdit",
	"WebFetch", "WebSearch", "Skill", "ToolSearch"}

// GeminiHostTools are the Gemini CLI tools that act on the agent's own
// host: with fs advertised only write_file, replace and read_file use
// fs/*; Gemini CLI never calls terminal/*.
var GeminiHostTools = []string{"run_shell_command", "list_background_processes", "read_background_output",
	"glob", "grep_search", "list_directory", "read_many_files", "web_fetch", "google_web_search", "invoke_agent"}

// geminiPolicy is an admin-tier policy (TOML, for --admin-policy) that
// denies GeminiHostTools; a tool denied with no argument pattern is
// removed from the model's tool list.
func geminiPolicy() string {
	names, _ := json.Marshal(GeminiHostTools)
	return "# tether: Gemini CLI's own host tools are denied; files and commands go through ACP.\n" +
		"[[rule]]\n" +
		"toolName = " + string(names) + "\n" +
		"decision = \"deny\"\n" +
		"priority = 900\n" +
		"denyMessage = \"denied by tether: this tool would act on the agent's host, not on the computer\"\n"
}

// all is every profile, in the order `tether-custodian agents` lists them.
var all = []*Profile{
	{Name: "claude-code", Kind: custodian.AgentPlain,
		About:   "Claude Code through claude-code-acp (node .../@zed-industries/claude-code-acp/dist/index.js)",
		Package: "@zed-industries/claude-code-acp", Tested: []string{"0.16.2"}, JailRead: "node_modules",
		Permission: "allow_once",
		SessionMeta: map[string]any{"claudeCode": map[string]any{"options": map[string]any{
			"settingSources":  []any{},
			"disallowedTools": anys(ClaudeCodeHostTools),
		}}},
		DeniedTools: ClaudeCodeHostTools,
		SetEnv:      []string{"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1"},
		// As root, claude-code-acp offers bypassPermissions when IS_SANDBOX
		// is set to anything, and Claude Code then refuses to start as root
		// unless it is exactly "1": every session fails.
		UnsetEnv: []string{"IS_SANDBOX"},
		Endpoint: &Endpoint{Env: "ANTHROPIC_BASE_URL", Host: "api.anthropic.com"},
	},
	{Name: "gemini", Kind: custodian.AgentPlain,
		About:   "Gemini CLI (node .../@google/gemini-cli/bundle/gemini.js --acp)",
		Package: "@google/gemini-cli", Tested: []string{"0.61.0"}, JailRead: "package",
		Permission:  "allow_once",
		DeniedTools: GeminiHostTools,
		Policy:      &Policy{FileName: "gemini-policy.toml", Flag: "--admin-policy", Content: geminiPolicy()},
		// It would otherwise re-exec node with a larger heap and talk ACP
		// from the child.
		SetEnv:   []string{"GEMINI_CLI_NO_RELAUNCH=1"},
		Endpoint: &Endpoint{Env: "GOOGLE_GEMINI_BASE_URL", Host: "generativelanguage.googleapis.com"},
	},
	{Name: custodian.AgentPlain, Kind: custodian.AgentPlain,
		About: "any other agent that knows nothing of tether: the custodian binds and tags its callbacks; nothing else is set"},
	{Name: custodian.AgentTether, Kind: custodian.AgentTether,
		About: "an agent that loads tether-plugin (the strict protocol); nothing else is set"},
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// All returns every profile, in listing order.
func All() []*Profile { return slices.Clone(all) }

// ErrUnknown is returned by Lookup for a name no profile has.
var ErrUnknown = errors.New("unknown agent profile")

// Lookup returns the profile called name.
func Lookup(name string) (*Profile, error) {
	for _, p := range all {
		if p.Name == name {
			return p, nil
		}
	}
	names := make([]string, len(all))
	for i, p := range all {
		names[i] = p.Name
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, strings.Join(names, ", "))
}

// ApplyConfig sets the profile's agent kind, permission (when the config
// sets none) and session options into cfg. A config whose session_meta
// sets a key the profile sets is refused: it would replace the denials.
func (p *Profile) ApplyConfig(cfg *custodian.Config) error {
	cfg.Agent = p.Kind
	if cfg.Permission == "" {
		cfg.Permission = p.Permission
	}
	if len(p.SessionMeta) == 0 {
		return nil
	}
	for k := range p.SessionMeta {
		if _, ok := cfg.SessionMeta[k]; ok {
			return fmt.Errorf("the config's session_meta sets %q, which the %s profile sets; remove it from the config", k, p.Name)
		}
	}
	meta := maps.Clone(cfg.SessionMeta)
	if meta == nil {
		meta = map[string]any{}
	}
	maps.Copy(meta, p.SessionMeta)
	cfg.SessionMeta = meta
	return nil
}

// Env returns env without UnsetEnv and SetEnv's names, then SetEnv.
func (p *Profile) Env(env []string) []string {
	drop := slices.Clone(p.UnsetEnv)
	for _, kv := range p.SetEnv {
		name, _, _ := strings.Cut(kv, "=")
		drop = append(drop, name)
	}
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(drop, name)
	})
	return append(out, p.SetEnv...)
}

// Install is the agent's package as found above its entry point.
type Install struct {
	// Dir is the package's directory; ReadRoot the tree the jail shows
	// (JailRead); Version its package.json's version.
	Dir, ReadRoot, Version string
}

// FindInstall looks, for each absolute argument of argv after the
// program, up the directory tree for the package.json of the profile's
// package, and returns the first found.
func (p *Profile) FindInstall(argv []string) (Install, error) {
	if p.Package == "" {
		return Install{}, errors.New("the profile names no package")
	}
	for _, a := range argv[min(1, len(argv)):] {
		if !filepath.IsAbs(a) {
			continue
		}
		for d := filepath.Dir(filepath.Clean(a)); d != "/"; d = filepath.Dir(d) {
			v, ok := packageVersion(filepath.Join(d, "package.json"), p.Package)
			if ok {
				return p.install(d, v), nil
			}
		}
	}
	return Install{}, fmt.Errorf("no package.json of %s above the agent's entry point in %q", p.Package, argv)
}

func (p *Profile) install(dir, version string) Install {
	in := Install{Dir: dir, ReadRoot: dir, Version: version}
	if p.JailRead == "node_modules" {
		for d := dir; d != "/"; d = filepath.Dir(d) {
			if filepath.Base(d) == "node_modules" {
				in.ReadRoot = d
				break
			}
		}
	}
	return in
}

// packageVersion reads path as package.json and returns its version
// when its name is pkg.
func packageVersion(path, pkg string) (string, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	var m struct{ Name, Version string }
	if json.Unmarshal(data, &m) != nil || m.Name != pkg {
		return "", false
	}
	return m.Version, true
}

// VersionWarning is "" for a tested version, otherwise a warning naming
// the versions that are tested.
func (p *Profile) VersionWarning(version string) string {
	if slices.Contains(p.Tested, version) {
		return ""
	}
	return fmt.Sprintf("the %s profile is tested with %s %s, not %q: its host tools may have changed; check docs/agents.md",
		p.Name, p.Package, strings.Join(p.Tested, ", "), version)
}

// ErrEndpoint is returned by EndpointIn for a base URL it cannot use.
var ErrEndpoint = errors.New("agent endpoint")

// Target is where an agent's model endpoint is.
type Target struct {
	Host string
	Port uint16
	// Plain is true for an http (not https) base URL: the agent's
	// requests to it carry no TLS.
	Plain bool
}

// EndpointIn returns the profile's model endpoint in env (the last
// Endpoint.Env setting wins, as in exec), and false when the profile
// knows none. A base URL must be http or https with a host and no user
// info; its port defaults to the scheme's.
func (p *Profile) EndpointIn(env []string) (Target, bool, error) {
	if p.Endpoint == nil {
		return Target{}, false, nil
	}
	raw := ""
	for _, kv := range env {
		if v, found := strings.CutPrefix(kv, p.Endpoint.Env+"="); found {
			raw = v
		}
	}
	if raw == "" {
		return Target{Host: p.Endpoint.Host, Port: 443}, true, nil
	}
	t, err := parseEndpoint(raw)
	if err != nil {
		return Target{}, false, fmt.Errorf("%w: %s=%q: %w", ErrEndpoint, p.Endpoint.Env, raw, err)
	}
	return t, true, nil
}

// parseEndpoint reads a base URL's host, port and scheme.
func parseEndpoint(raw string) (Target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Target{}, err
	}
	defPort := map[string]uint16{"http": 80, "https": 443}[u.Scheme]
	switch {
	case defPort == 0:
		return Target{}, fmt.Errorf("scheme %q: want http or https", u.Scheme)
	case u.Hostname() == "":
		return Target{}, errors.New("no host")
	case u.User != nil:
		return Target{}, errors.New("user info in the URL")
	}
	t := Target{Host: strings.ToLower(u.Hostname()), Port: defPort, Plain: u.Scheme == "http"}
	if u.Port() == "" {
		return t, nil
	}
	n, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil || n == 0 {
		return Target{}, fmt.Errorf("port %q", u.Port())
	}
	t.Port = uint16(n)
	return t, nil
}
