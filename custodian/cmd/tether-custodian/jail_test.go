package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// jailAgent copies this test binary, named test-agent, where the jail's
// uid can reach it (the test binary's own directory is root's alone), and
// shows that copy as the jail's init and stubs.
func jailAgent(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	dir := "/var/lib/tether-jailtest-" + hex.EncodeToString(b)
	t.Cleanup(func() { os.RemoveAll(dir) })
	realrecv.Must(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	self, err := os.ReadFile("/proc/self/exe")
	realrecv.Must(t, err)
	agent := filepath.Join(dir, "bin", "test-agent")
	realrecv.Must(t, os.WriteFile(agent, self, 0o755))
	jailHelper = agent
	t.Cleanup(func() { jailHelper = "" })
	return agent
}

// runConfig writes a run config for rr in dir and an audit key.
func runConfig(t *testing.T, rr *realrecv.Receiver, dir string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"audit", "keygen", "--name", "tether.test/custodian", "--out", filepath.Join(dir, "audit")}, nil, &out, &errb); code != 0 {
		t.Fatalf("keygen: %d %s", code, &errb)
	}
	cfg := map[string]any{
		"tuple": rr.Tuple, "lease_not_after": time.Now().Add(time.Hour).UTC(), "principal": rr.Tuple.Owner,
		"receiver":  map[string]any{"kind": "unix", "path": rr.Sock, "host_only": true},
		"state_dir": "state", "audit_key_file": "audit.key",
	}
	data, err := json.Marshal(cfg)
	realrecv.Must(t, err)
	path := filepath.Join(dir, "c.json")
	realrecv.Must(t, os.WriteFile(path, data, 0o600))
	return path
}

// agentRecords returns the agent records of the audit log in state.
func agentRecords(t *testing.T, state string) []*audit.Record {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(state, custodian.AuditDir, audit.LogFile))
	realrecv.Must(t, err)
	lines, _, err := audit.SplitLog(data)
	realrecv.Must(t, err)
	var out []*audit.Record
	for _, l := range lines {
		r, err := audit.DecodeRecord(l)
		realrecv.Must(t, err)
		if r.Kind == audit.KindAgent {
			out = append(out, r)
		}
	}
	return out
}

// TestIntegrationRunJailsByDefault: `run` without flags starts the agent
// in the jail (its start-up line on stderr, an audit record "jailed" with
// the jail's digest), the agent still does its work through ACP, and
// --no-jail is recorded as such.
func TestIntegrationRunJailsByDefault(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	rr := realrecv.Start(t)
	agent := jailAgent(t)
	dir := t.TempDir()
	cfg := runConfig(t, rr, dir)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--config", cfg, "--prompt", "write ROOT/jailed.txt from the jail", "--", agent},
		nil, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("run: exit %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	if !regexp.MustCompile(`^tether jail: the agent runs confined: uid 59\d{3} gid 59\d{3},`).MatchString(stderr.String()) {
		t.Errorf("the jail's start-up line is not on stderr:\n%s", &stderr)
	}
	if !strings.Contains(stderr.String(), `tether jail: network host (jail.network "host"): the agent shares the host's network and reaches every service on the host`) {
		t.Errorf("the jail does not state at start that it shares the host's network:\n%s", &stderr)
	}
	if data, err := os.ReadFile(rr.File("jailed.txt")); err != nil || string(data) != "from the jail\n" {
		t.Errorf("the jailed agent's write through ACP: %q, %v", data, err)
	}
	stderr.Reset()
	code = run(context.Background(), []string{"run", "--no-jail", "--config", cfg, "--prompt", "read ROOT/jailed.txt", "--", agent},
		nil, &stdout, &stderr)
	if code != exitOK || strings.Contains(stderr.String(), "tether jail") {
		t.Fatalf("run --no-jail: exit %d, stderr:\n%s", code, &stderr)
	}
	recs := agentRecords(t, filepath.Join(dir, "state"))
	if len(recs) != 2 {
		t.Fatalf("agent records %+v, want two", recs)
	}
	j, u := recs[0], recs[1]
	if j.Outcome != custodian.AgentJailed || j.Code != custodian.CodeNetworkHost || len(j.Digests["jail"]) != 64 || len(j.Digests["argv"]) != 64 ||
		j.TupleSHA256 != rr.Tuple.SHA256() || j.Principal != rr.Tuple.Owner {
		t.Errorf("first run's record %+v, want jailed, code network_host (no endpoint known: the host's network), "+
			"with the jail's and argv's digests, the tuple and principal", j)
	}
	if u.Outcome != custodian.AgentUnjailed || u.Code != custodian.CodeNoJail || u.Digests["jail"] != "" {
		t.Errorf("--no-jail run's record %+v, want unjailed, code no_jail, no jail digest", u)
	}
	stdout.Reset()
	if code := run(context.Background(), []string{"audit", "verify", "--state", filepath.Join(dir, "state"), "--pubkey", filepath.Join(dir, "audit.pub")},
		nil, &stdout, &stderr); code != exitOK {
		t.Errorf("audit verify: exit %d\n%s%s", code, &stdout, &stderr)
	}
}

// TestRunJailRefusesHiddenPaths: --jail-read of the custodian's own state
// is refused before the agent starts, naming the path.
func TestIntegrationRunJailRefusesHiddenPaths(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	rr := realrecv.Start(t)
	agent := jailAgent(t)
	dir := t.TempDir()
	cfg := runConfig(t, rr, dir)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--config", cfg, "--jail-read", filepath.Join(dir, "state"), "--prompt", "x", "--", agent},
		nil, &stdout, &stderr)
	if code != exitRuntime || !strings.Contains(stderr.String(), "jail: path must stay hidden") || !strings.Contains(stderr.String(), filepath.Join(dir, "state")) {
		t.Fatalf("run --jail-read STATE: exit %d, stderr:\n%s", code, &stderr)
	}
	if recs := agentRecords(t, filepath.Join(dir, "state")); len(recs) != 0 {
		t.Errorf("an agent record %+v for an agent that never started", recs)
	}
}

// TestIntegrationRunJailLimitFlags: --jail-memory, --jail-pids and
// --jail-cgroup reach the jail, which states them at start; a limit below
// the minimum is refused before anything starts.
func TestIntegrationRunJailLimitFlags(t *testing.T) {
	testenv.Require(t, "root", "bwrap", "cgroup-limits")
	rr := realrecv.Start(t)
	agent := jailAgent(t)
	dir := t.TempDir()
	cfg := runConfig(t, rr, dir)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--config", cfg, "--jail-memory", "1073741824", "--jail-pids", "100",
		"--prompt", "read ROOT/none", "--", agent}, nil, &stdout, &stderr)
	if code != exitOK || !regexp.MustCompile(`(?m)^tether jail: bounds: own uid 59\d{3} \(drawn from jail.uid_range 59000-59998, held while the jail runs\); `+
		`cgroup (v1|2) .*tether-jail-59\d{3}: memory 1073741824 bytes, no swap; pids 100; RLIMIT_NPROC 100; `+
		`network host: TCP bind refused \(Landlock ABI \d+\), Multipath TCP and io_uring refused \(seccomp\), `+
		`listen allowed for the plugin's socket \(a TCP listen without bind would get an ephemeral port\), connect allowed$`).MatchString(stderr.String()) {
		t.Errorf("run --jail-memory --jail-pids: exit %d; want the bounds stated at start, stderr:\n%s", code, &stderr)
	}
	stderr.Reset()
	code = run(context.Background(), []string{"run", "--config", cfg, "--jail-cgroup", "off", "--prompt", "read ROOT/none", "--", agent},
		nil, &stdout, &stderr)
	if code != exitOK || !strings.Contains(stderr.String(), `no cgroup (jail.cgroup "off", the operator's opt-out): memory unbounded`) {
		t.Errorf("run --jail-cgroup off: exit %d; want the opt-out stated at start, stderr:\n%s", code, &stderr)
	}
	stderr.Reset()
	code = run(context.Background(), []string{"run", "--config", cfg, "--jail-pids", "2", "--prompt", "x", "--", agent}, nil, &stdout, &stderr)
	if code != exitRuntime || !strings.Contains(stderr.String(), "jail.max_pids 2") {
		t.Errorf("run --jail-pids 2: exit %d; want it refused naming jail.max_pids, stderr:\n%s", code, &stderr)
	}
}

// TestIntegrationRunEndsAnAgentThatIgnoresEOF: an agent that keeps running
// after its stdin closed (as claude-code-acp does) is asked to end with
// SIGTERM after agentEOFGrace, jailed (SIGTERM reaches the agent inside
// the jail, not only bwrap, whose death would SIGKILL it) and with
// --no-jail: the agent's own SIGTERM handler runs, it is not killed, and
// the run ends without an error.
func TestIntegrationRunEndsAnAgentThatIgnoresEOF(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	rr := realrecv.Start(t)
	agent := jailAgent(t)
	t.Setenv("TEST_AGENT_IGNORE_EOF", "1")
	for _, mode := range [][]string{nil, {"--no-jail"}} {
		dir := t.TempDir()
		cfg := runConfig(t, rr, dir)
		var stdout, stderr bytes.Buffer
		start := time.Now()
		args := append(append([]string{"run", "--config", cfg}, mode...), "--prompt", "read ROOT/none", "--", agent)
		code := run(context.Background(), args, nil, &stdout, &stderr)
		took := time.Since(start)
		if code != exitOK || !strings.Contains(stderr.String(), "test-agent: ended on SIGTERM") {
			t.Fatalf("run %v: exit %d after %v; want 0 and the agent ended by SIGTERM\nstderr:\n%s", mode, code, took, &stderr)
		}
		if strings.Contains(stderr.String(), "killed") {
			t.Errorf("run %v: the agent was killed, not asked to end (stderr:\n%s)", mode, &stderr)
		}
		t.Logf("run %v: %v", mode, took)
	}
}
