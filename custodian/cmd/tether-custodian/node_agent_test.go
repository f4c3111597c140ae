package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationNodeAgent runs fixtures/node/agent.mjs, an ACP agent
// written with the official TypeScript SDK, through `tether-custodian run`
// against a real receiver, in both modes: plain (no attach, no op tags,
// run with --agent plain) and tether (attach and op tags as
// docs/custodian.md says). Both send bare command names and shell lines
// with no PATH and no cwd; the agent checks exec, write/read, refusals,
// output polled while running, kill and release twice, the output limit
// and the deadline (tether mode also op-key replay and reattach after a
// fence), and reports each check; this test checks what only the host can
// see: the files' owner, the receipts and the audit log.
func TestIntegrationNodeAgent(t *testing.T) {
	testenv.Require(t, "root", "node", "bwrap") // "node" checks the SDK is installed; the agent runs in the jail
	nodeDir, err := filepath.Abs("../../../fixtures/node")
	realrecv.Must(t, err)
	common := []string{"exec_bare", "exec_shell", "write_read", "read_missing", "refusal_path", "refusal_relative", "refusal_session",
		"poll_running", "kill_twice_release_twice", "output_limit", "deadline"}
	for _, mode := range []struct {
		name   string
		agent  []string
		run    []string
		checks []string
	}{
		{"plain", []string{filepath.Join(nodeDir, "agent.mjs")}, []string{"--agent", "plain"}, append(slices.Clone(common), "wrong_tag_fences")},
		{"tether", []string{filepath.Join(nodeDir, "agent.mjs"), "--tether"}, nil, append(slices.Clone(common), "replay", "fence_and_reattach")},
	} {
		t.Run(mode.name, func(t *testing.T) {
			rr := realrecv.Start(t)
			dir := nodeRunDir(t, rr, "5s")
			node, err := exec.LookPath("node")
			realrecv.Must(t, err)
			node, err = filepath.EvalSymlinks(node)
			realrecv.Must(t, err)
			// The agent runs in the agent jail, as any agent does by default:
			// it may read its install tree and execute node.
			jailAgent(t)
			args := append([]string{"run", "--config", filepath.Join(dir, "c.json"), "--jail-read", nodeDir, "--jail-exec", node}, mode.run...)
			args = append(append(args, "--prompt", "scenario", "--"), append([]string{node}, mode.agent...)...)
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), args, nil, &stdout, &stderr); code != exitOK {
				t.Fatalf("run exit %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
			}
			msgs := agentMessages(t, stdout.Bytes())
			for _, m := range msgs {
				if strings.HasPrefix(m, "FAIL") {
					t.Errorf("agent: %s", m)
				}
			}
			for _, c := range mode.checks {
				if !slices.ContainsFunc(msgs, func(m string) bool { return m == "PASS "+c || strings.HasPrefix(m, "PASS "+c+" ") }) {
					t.Errorf("check %s did not pass; agent said:\n%s", c, strings.Join(msgs, "\n"))
				}
			}
			grantUID, _ := realrecv.GrantIDs()
			uid := fmt.Sprintf("uid=%d", grantUID)
			for _, c := range []string{"exec_bare", "exec_shell"} {
				if !slices.Contains(msgs, "PASS "+c+" "+uid) {
					t.Errorf("%s did not run as the grant's uid: %v", c, msgs)
				}
			}
			if !slices.Contains(msgs, "PASS kill_twice_release_twice signal=KILL") {
				t.Errorf("kill: %v", msgs)
			}
			checkNodeRunOnHost(t, rr, dir, mode.name == "plain")
		})
	}
}

// nodeRunDir writes the run's config and audit key: the granted tuple, a
// one-hour lease and the command budget (the plain agent's deadline check
// uses 5 s; a test that only moves data gives the default, so a loaded
// machine cannot make its reads outlast the budget).
func nodeRunDir(t *testing.T, rr *realrecv.Receiver, budget string) string {
	dir := t.TempDir()
	skey, vkey, err := audit.GenerateKey("tether.test/custodian")
	realrecv.Must(t, err)
	realrecv.Must(t, os.WriteFile(filepath.Join(dir, "audit.key"), []byte(skey), 0o600))
	realrecv.Must(t, os.WriteFile(filepath.Join(dir, "audit.pub"), []byte(vkey), 0o644))
	cfg := map[string]any{"tuple": rr.Tuple, "lease_not_after": time.Now().Add(time.Hour).UTC(), "principal": rr.Tuple.Owner,
		"receiver": map[string]any{"kind": "unix", "path": rr.Sock, "host_only": true}, "state_dir": "state",
		"audit_key_file": "audit.key", "command_budget": budget}
	data, _ := json.Marshal(cfg)
	realrecv.Must(t, os.WriteFile(filepath.Join(dir, "c.json"), data, 0o600))
	return dir
}

// agentMessages returns the text of every agent_message_chunk run printed.
func agentMessages(t *testing.T, stdout []byte) []string {
	var out []string
	for _, line := range bytes.Split(bytes.TrimSpace(stdout), []byte("\n")) {
		var n struct {
			Update struct {
				SessionUpdate string `json:"sessionUpdate"`
				Content       struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"update"`
		}
		realrecv.Must(t, json.Unmarshal(line, &n))
		if n.Update.SessionUpdate == "agent_message_chunk" {
			out = append(out, n.Update.Content.Text)
		}
	}
	return out
}

// checkNodeRunOnHost: the files the agent made are the grant user's, in
// the root; every terminal/create receipt is final and, for the plain
// agent, tagged_by custodian (and for the tether agent not); the audit log
// verifies.
func checkNodeRunOnHost(t *testing.T, rr *realrecv.Receiver, dir string, plain bool) {
	grantUID, _ := realrecv.GrantIDs()
	for _, f := range []string{"ran.txt", "hello.txt"} {
		fi, err := os.Stat(rr.File(f))
		realrecv.Must(t, err)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != grantUID {
			t.Errorf("%s owned by uid %d, want the grant's %d", f, st.Uid, grantUID)
		}
	}
	rs, err := opstore.ReadOnly(filepath.Join(dir, "state", custodian.OpKeysDir))
	realrecv.Must(t, err)
	creates := 0
	for _, r := range rs {
		if r.Method != "terminal/create" {
			continue
		}
		creates++
		if tagged := r.TaggedBy == custodian.TaggedByCustodian; tagged != plain || !r.Outcome.Final() {
			t.Errorf("create receipt %s: tagged_by %q, outcome %s (plain agent: %v)", r.OpKey, r.TaggedBy, r.Outcome, plain)
		}
	}
	if creates < 10 {
		t.Errorf("%d terminal/create receipts, want at least 10", creates)
	}
	var out bytes.Buffer
	pub := filepath.Join(dir, "audit.pub")
	if code := run(context.Background(), []string{"audit", "verify", "--state", filepath.Join(dir, "state"), "--pubkey", pub}, nil, &out, &out); code != exitOK ||
		!regexp.MustCompile(`OK: \d+ records`).Match(out.Bytes()) {
		t.Errorf("audit verify exit %d:\n%s", code, &out)
	}
}

// TestIntegrationNodeAgentBigFile: the TypeScript agent writes a 20 MiB
// generated file through tether-custodian run and a real receiver (in
// chunks of one frame: acp-go-sdk alone could not even read its 20 MiB
// request line) and reads it back byte-identical; on the host the file
// has the digest the agent computed, is the grant user's, and the write's
// receipt is verified.
func TestIntegrationNodeAgentBigFile(t *testing.T) {
	testenv.Require(t, "root", "node")
	nodeDir, err := filepath.Abs("../../../fixtures/node")
	realrecv.Must(t, err)
	rr := realrecv.Start(t)
	dir := nodeRunDir(t, rr, "10m")
	node, err := exec.LookPath("node")
	realrecv.Must(t, err)
	node, err = filepath.EvalSymlinks(node)
	realrecv.Must(t, err)
	jailAgent(t)
	args := []string{"run", "--config", filepath.Join(dir, "c.json"), "--jail-read", nodeDir, "--jail-exec", node,
		"--prompt", "bigfile: big.txt 20971520", "--", node, filepath.Join(nodeDir, "agent.mjs"), "--tether"}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, nil, &stdout, &stderr); code != exitOK {
		t.Fatalf("run exit %d\nstderr:\n%s", code, &stderr)
	}
	msgs := agentMessages(t, stdout.Bytes())
	if len(msgs) != 1 || !strings.HasPrefix(msgs[0], "PASS bigfile ") {
		t.Fatalf("agent said %v\nstderr:\n%s", msgs, &stderr)
	}
	f := strings.Fields(msgs[0])
	data, err := os.ReadFile(rr.File("big.txt"))
	realrecv.Must(t, err)
	if got := fmt.Sprintf("%x", sha256.Sum256(data)); got != f[2] || f[3] != "20971520" || len(data) != 20<<20 {
		t.Fatalf("file on the host: %d bytes sha256 %s; the agent wrote %s bytes sha256 %s", len(data), got, f[3], f[2])
	}
	fi, err := os.Stat(rr.File("big.txt"))
	realrecv.Must(t, err)
	if uid, _ := realrecv.GrantIDs(); fi.Sys().(*syscall.Stat_t).Uid != uid {
		t.Fatalf("big.txt owned by uid %d, want the grant's %d", fi.Sys().(*syscall.Stat_t).Uid, uid)
	}
	rs, err := opstore.ReadOnly(filepath.Join(dir, "state", custodian.OpKeysDir))
	realrecv.Must(t, err)
	writes := 0
	for _, r := range rs {
		if r.Method == "fs/write_text_file" {
			writes++
			if r.Outcome != opstore.Verified || len(r.Files) != 1 || r.Files[0].Actual != f[2] {
				t.Fatalf("write receipt: %+v", r)
			}
		}
	}
	if writes != 1 {
		t.Fatalf("%d write receipts, want 1", writes)
	}
}
