package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// loopbackServer serves body on the host's loopback.
func loopbackServer(t *testing.T, body string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) }))
	t.Cleanup(s.Close)
	return s
}

// withJailNetwork rewrites the run config at path with jail.network set.
func withJailNetwork(t *testing.T, path, network string) {
	t.Helper()
	data, err := os.ReadFile(path)
	realrecv.Must(t, err)
	var cfg map[string]any
	realrecv.Must(t, json.Unmarshal(data, &cfg))
	cfg["jail"] = map[string]any{"network": network}
	data, err = json.Marshal(cfg)
	realrecv.Must(t, err)
	realrecv.Must(t, os.WriteFile(path, data, 0o600))
}

// TestIntegrationRunAgentNetwork: `run --agent claude-code` with no
// jail.network puts the agent behind the egress proxy with a policy
// allowing its endpoint (ANTHROPIC_BASE_URL, here a model stand-in on the
// host's loopback) alone: the agent's own fetch of the endpoint works,
// its fetch of another service on the host's loopback is refused through
// the proxy (and stated on stderr), the start says what the proxy allows,
// and the agent record carries no network_host code. Positive control:
// with jail.network "host" the same agent fetches both, and the record
// says network_host.
func TestIntegrationRunAgentNetwork(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	rr := realrecv.Start(t)
	agent := jailAgent(t)
	model, other := loopbackServer(t, "model says hi"), loopbackServer(t, "a host service")
	t.Setenv("ANTHROPIC_BASE_URL", model.URL)
	t.Setenv("TEST_AGENT_PLAIN", "1")
	dir := t.TempDir()
	cfg := runConfig(t, rr, dir)
	args := []string{"run", "--config", cfg, "--agent", "claude-code",
		"--prompt", "fetch " + model.URL + "/v1/messages", "--prompt", "fetch " + other.URL + "/", "--", agent}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, nil, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("run: exit %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	port := strings.TrimPrefix(model.URL, "http://127.0.0.1:")
	for _, want := range []string{
		"tether jail: network proxy: own network namespace with only loopback and no route out; the egress proxy at 127.0.0.1:3128 " +
			"(HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) lets the agent reach 127.0.0.1/32:" + port + " presets agent-endpoint",
		"tether jail: egress refused " + strings.TrimPrefix(other.URL, "http://"),
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, &stderr)
		}
	}
	if !strings.Contains(stdout.String(), "ok fetch 200 model says hi") {
		t.Errorf("the agent did not reach its endpoint through the proxy:\n%s", &stdout)
	}
	if !strings.Contains(stdout.String(), "ok fetch 403") || strings.Contains(stdout.String(), "a host service") {
		t.Errorf("the agent's fetch of another host service was not refused by the proxy:\n%s", &stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", AgentEgressLog)); err != nil {
		t.Errorf("the agent's egress log: %v", err)
	}

	withJailNetwork(t, cfg, "host")
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), args, nil, &stdout, &stderr); code != exitOK {
		t.Fatalf("run with network host: exit %d\nstderr:\n%s", code, &stderr)
	}
	if !strings.Contains(stdout.String(), "ok fetch 200 model says hi") || !strings.Contains(stdout.String(), "ok fetch 200 a host service") {
		t.Errorf("positive control: under network host the agent should reach both services:\n%s", &stdout)
	}
	recs := agentRecords(t, filepath.Join(dir, "state"))
	if len(recs) != 2 || recs[0].Code != "" || recs[1].Code != custodian.CodeNetworkHost {
		t.Errorf("agent records %+v; want the proxy run without a code, the host run with network_host", recs)
	}
}
