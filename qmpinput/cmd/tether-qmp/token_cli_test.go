package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTokenAndAuditCLI: mint prints a one-time link whose secret is not
// stored, list shows no secret, revoke marks it, every change is
// audited, audit verify passes, and an edited log fails it.
func TestTokenAndAuditCLI(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if code, out, _ := runCLI(t, "", "token", "mint", "--state", state, "--role", "control", "--ttl", "1h"); code != exitFailed || !strings.Contains(out, `"code":"origin"`) {
		t.Fatalf("mint without an origin: %d %s", code, out)
	}
	code, out, _ := runCLI(t, "", "token", "mint", "--state", state, "--role", "control", "--ttl", "1h", "--label", "alice", "--origin", "http://127.0.0.1:8443")
	var m struct {
		ID   string `json:"id"`
		Link string `json:"link"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &m) != nil || !strings.HasPrefix(m.Link, "http://127.0.0.1:8443/#t="+m.ID+".") {
		t.Fatalf("mint: %d %s", code, out)
	}
	secret := strings.SplitN(m.Link, ".", 4)[3]
	raw, _ := os.ReadFile(filepath.Join(state, "tokens.json"))
	if strings.Contains(string(raw), secret) {
		t.Fatal("the token file holds the secret")
	}
	code, out, _ = runCLI(t, "", "token", "list", "--state", state)
	if code != exitOK || !strings.Contains(out, m.ID) || strings.Count(out, "\n") != 1 {
		t.Fatalf("list: %d %s", code, out)
	}
	if strings.Contains(out, "secret_sha256\":\"") && !strings.Contains(out, "secret_sha256\":\"\"") {
		t.Fatalf("list shows the secret's hash: %s", out)
	}
	if code, out, _ = runCLI(t, "", "token", "revoke", "--state", state, "--id", m.ID); code != exitOK || !strings.Contains(out, `"revoked"`) {
		t.Fatalf("revoke: %d %s", code, out)
	}
	if code, out, _ = runCLI(t, "", "token", "revoke", "--state", state, "--id", "0000000000000000"); code != exitFailed || !strings.Contains(out, `"code":"unknown"`) {
		t.Fatalf("revoke unknown: %d %s", code, out)
	}
	code, out, _ = runCLI(t, "", "audit", "verify", "--state", state)
	if code != exitOK || !strings.Contains(out, `"entries":2`) || !strings.Contains(out, `"token_mint":1`) {
		t.Fatalf("audit verify: %d %s", code, out)
	}
	var v struct{ Head string }
	json.Unmarshal([]byte(out), &v)
	if code, out, _ = runCLI(t, "", "audit", "verify", "--state", state, "--checkpoint", "2:"+v.Head); code != exitOK {
		t.Fatalf("verify against its own head: %d %s", code, out)
	}
	log := filepath.Join(state, "audit.jsonl")
	b, _ := os.ReadFile(log)
	os.WriteFile(log, []byte(strings.Replace(string(b), "alice", "mallory", 1)), 0o600)
	if code, out, _ = runCLI(t, "", "audit", "verify", "--state", state); code != exitFailed || !strings.Contains(out, `"code":"audit_chain"`) {
		t.Fatalf("verify after an edit: %d %s", code, out)
	}
}

func TestViewCLIRefusals(t *testing.T) {
	for _, cmd := range [][]string{{"view", "--help"}, {"token", "mint", "--help"}, {"audit", "--help"}} {
		if code, out, _ := runCLI(t, "", cmd...); code != exitOK || !strings.Contains(out, "usage: tether-qmp") {
			t.Errorf("%v: %d %q", cmd, code, out)
		}
	}
	state := filepath.Join(t.TempDir(), "state")
	// A public address without TLS is refused before anything else.
	code, out, _ := runCLI(t, "", "view", "--socket", "/nonexistent/qmp.sock", "--vnc", "/nonexistent/vnc.sock", "--state", state, "--listen", "0.0.0.0:0")
	if code != exitFailed || !strings.Contains(out, "not loopback") {
		t.Fatalf("public listen without TLS: %d %s", code, out)
	}
	if code, _, _ := runCLI(t, "", "view", "--socket", "/x"); code != exitUsage {
		t.Fatalf("view without --vnc/--state: %d", code)
	}
}
