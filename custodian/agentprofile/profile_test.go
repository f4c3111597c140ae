package agentprofile

import (
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
