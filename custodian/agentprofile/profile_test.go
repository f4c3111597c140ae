package agentprofile

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tetherdev/tether/custodian"
)

// TestApplyConfig: a profile makes the agent plain, sets its session
// options and a permission only where the config sets none, and refuses a
// config whose session_meta would replace the profile's denials.
func TestApplyConfig(t *testing.T) {
	p, err := Lookup("claude-code")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &custodian.Config{Agent: custodian.AgentTether, SessionMeta: map[string]any{"other": true}}
	if err := p.ApplyConfig(cfg); err != nil {
		t.Fatal(err)
	}
	opts := cfg.SessionMeta["claudeCode"].(map[string]any)["options"].(map[string]any)
	if cfg.Agent != custodian.AgentPlain || cfg.Permission != "allow_once" || cfg.SessionMeta["other"] != true ||
		!reflect.DeepEqual(opts["disallowedTools"], anys(ClaudeCodeHostTools)) || len(opts["settingSources"].([]any)) != 0 {
		t.Fatalf("applied config: agent %q, permission %q, meta %v", cfg.Agent, cfg.Permission, cfg.SessionMeta)
	}
	cfg = &custodian.Config{Permission: "reject"}
	if err := p.ApplyConfig(cfg); err != nil || cfg.Permission != "reject" {
		t.Fatalf("the config's own permission was replaced: %q, %v", cfg.Permission, err)
	}
	cfg = &custodian.Config{SessionMeta: map[string]any{"claudeCode": map[string]any{}}}
	if err := p.ApplyConfig(cfg); err == nil || !strings.Contains(err.Error(), `sets "claudeCode"`) {
		t.Fatalf("a config replacing the profile's session options: %v", err)
	}
	if _, err := Lookup("claude"); err == nil || !strings.Contains(err.Error(), "claude-code, gemini, plain, tether") {
		t.Fatalf("unknown profile: %v", err)
	}
}

// TestEnv: the claude-code profile removes IS_SANDBOX (any value) and sets
// its two variables over the caller's.
func TestEnv(t *testing.T) {
	p, _ := Lookup("claude-code")
	got := p.Env([]string{"PATH=/bin", "IS_SANDBOX=yes", "DISABLE_AUTOUPDATER=0", "ANTHROPIC_API_KEY=k"})
	want := []string{"PATH=/bin", "ANTHROPIC_API_KEY=k", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1"}
	if !slices.Equal(got, want) {
		t.Fatalf("Env = %q, want %q", got, want)
	}
}

// TestFindInstall: the package.json above the entry point names the
// version; the jail is shown the package (gemini) or its node_modules
// (claude-code); an untested version is warned about, naming the tested.
func TestFindInstall(t *testing.T) {
	nm := filepath.Join(t.TempDir(), "node_modules")
	pkg := filepath.Join(nm, "@google", "gemini-cli")
	if err := os.MkdirAll(filepath.Join(pkg, "bundle"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pkg, "package.json"), []byte(`{"name":"@google/gemini-cli","version":"0.62.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	g, _ := Lookup("gemini")
	in, err := g.FindInstall([]string{"node", filepath.Join(pkg, "bundle", "gemini.js"), "--acp"})
	if err != nil || in.Dir != pkg || in.ReadRoot != pkg || in.Version != "0.62.0" {
		t.Fatalf("FindInstall = %+v, %v", in, err)
	}
	if w := g.VersionWarning(in.Version); !strings.Contains(w, "tested with @google/gemini-cli 0.61.0, not \"0.62.0\"") {
		t.Fatalf("warning %q", w)
	}
	if w := g.VersionWarning("0.61.0"); w != "" {
		t.Fatalf("a tested version warned: %q", w)
	}
	c, _ := Lookup("claude-code")
	if _, err := c.FindInstall([]string{"node", filepath.Join(pkg, "bundle", "gemini.js")}); err == nil {
		t.Fatal("claude-code found gemini's package")
	}
	if got := c.install(pkg, "x").ReadRoot; got != nm {
		t.Fatalf("claude-code's jail read %s, want %s", got, nm)
	}
}

// TestEndpointIn: a profile's endpoint is its public API host on 443, or
// the base URL its environment variable sets; a bad base URL is refused.
func TestEndpointIn(t *testing.T) {
	cc, err := Lookup("claude-code")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  []string
		want Target
		err  bool
	}{
		{nil, Target{"api.anthropic.com", 443, false}, false},
		{[]string{"ANTHROPIC_BASE_URL=http://127.0.0.1:8080/v1"}, Target{"127.0.0.1", 8080, true}, false},
		{[]string{"ANTHROPIC_BASE_URL=https://Gateway.Example.com"}, Target{"gateway.example.com", 443, false}, false},
		{[]string{"ANTHROPIC_BASE_URL=http://[::1]"}, Target{"::1", 80, true}, false},
		{[]string{"ANTHROPIC_BASE_URL=ftp://x.example"}, Target{}, true},
		{[]string{"ANTHROPIC_BASE_URL=https://user:pw@x.example"}, Target{}, true},
		{[]string{"ANTHROPIC_BASE_URL=https://x.example:0"}, Target{}, true},
		{[]string{"ANTHROPIC_BASE_URL=x.example"}, Target{}, true},
	} {
		got, ok, err := cc.EndpointIn(c.env)
		if c.err {
			if !errors.Is(err, ErrEndpoint) || ok {
				t.Errorf("%v: ok %v err %v, want ErrEndpoint", c.env, ok, err)
			}
			continue
		}
		if err != nil || !ok || got != c.want {
			t.Errorf("%v: %+v %v %v, want %+v", c.env, got, ok, err, c.want)
		}
	}
	gem, _ := Lookup("gemini")
	if got, ok, _ := gem.EndpointIn(nil); !ok || got != (Target{"generativelanguage.googleapis.com", 443, false}) {
		t.Errorf("gemini: %+v %v", got, ok)
	}
	plain, _ := Lookup("plain")
	if _, ok, err := plain.EndpointIn([]string{"ANTHROPIC_BASE_URL=http://x"}); ok || err != nil {
		t.Errorf("plain: ok %v err %v, want no endpoint", ok, err)
	}
}

// FuzzParseEndpoint: a base URL either parses to a host and a non-zero
// port, or is refused; it never panics.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"https://api.anthropic.com", "http://127.0.0.1:8080/v1", "http://[::1]:9", "ftp://x", "https://u@x", "http://x:99999", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := parseEndpoint(raw)
		if err == nil && (got.Host == "" || got.Port == 0) {
			t.Fatalf("%q: %+v without an error", raw, got)
		}
	})
}
