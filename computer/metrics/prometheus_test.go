package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationPrometheusScrapes: Debian's real prometheus server
// scrapes the handler on loopback every second, and its query API
// answers the values the test set, and then a transition it makes: computers by state, the pool, the
// lease expiries, a histogram's count and a computer's cgroup reading.
func TestIntegrationPrometheusScrapes(t *testing.T) {
	testenv.Require(t, "prometheus")
	m := New(func(context.Context) map[string]api.Usage {
		return map[string]api.Usage{"c-1": {CPUSeconds: 1.5, MemoryBytes: 1 << 20, Pids: 3}}
	})
	m.SetComputers(map[string]int{api.StateRunning: 2, api.StateSuspended: 1})
	m.SetPoolSize("small", 4)
	m.LeaseExpired()
	m.ObserveCreate(40 * time.Millisecond)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)

	base := startPrometheus(t, strings.TrimPrefix(srv.URL, "http://"))
	for query, want := range map[string]string{
		`tether_computers{state="running"}`:                 "2",
		`tether_computers{state="suspended"}`:               "1",
		`tether_computers{state="failed"}`:                  "0",
		`tether_pool_size{profile="small"}`:                 "4",
		`tether_lease_expiries_total`:                       "1",
		`tether_create_seconds_count`:                       "1",
		`tether_computer_memory_bytes{computer="c-1"}`:      "1048576",
		`tether_computer_pids{computer="c-1"}`:              "3",
		`tether_computer_cpu_seconds_total{computer="c-1"}`: "1.5",
	} {
		got := waitQuery(t, base, query, want)
		t.Logf("%s = %s", query, got)
	}
	// A later scrape sees a transition: the values are live, not a first
	// scrape's leftovers.
	m.Transition(api.StateRunning, api.StateExpiring)
	waitQuery(t, base, `tether_computers{state="running"}`, "1")
	waitQuery(t, base, `tether_computers{state="expiring"}`, "1")
}

// startPrometheus runs prometheus on a free loopback port with its own
// storage in a temp dir, scraping target every second, and returns the
// base URL of its HTTP API. Cleanup stops it (SIGTERM, then SIGKILL) and
// reaps it.
func startPrometheus(t *testing.T, target string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"+
		"scrape_configs:\n  - job_name: tether\n    static_configs:\n      - targets: [%q]\n", target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	listen := freeLoopbackPort(t)
	cmd := exec.Command("prometheus", "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+listen)
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	// Pdeathsig (see startHelper) keeps prometheus from outliving a
	// killed test binary; Cleanup stops it otherwise.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPrometheus(t, cmd, filepath.Join(dir, "prometheus.log")) })
	return "http://" + listen
}

func stopPrometheus(t *testing.T, cmd *exec.Cmd, log string) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("prometheus did not stop on SIGTERM within 20 s")
	}
	if t.Failed() {
		out, _ := os.ReadFile(log)
		t.Logf("prometheus log:\n%s", out)
	}
}

// freeLoopbackPort returns 127.0.0.1:PORT of a port that was free a
// moment ago.
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitQuery polls the instant query API until query has exactly one
// series whose value is want, for at most 60 s, and returns the value.
func waitQuery(t *testing.T, base, query, want string) string {
	t.Helper()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
	last := ""
	for {
		got, err := instantQuery(base, query)
		if err == nil && got == want {
			return got
		}
		last = fmt.Sprintf("%q, %v", got, err)
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("prometheus never answered %s = %s; last %s", query, want, last)
		}
	}
}

// instantQuery asks /api/v1/query for query and returns the value of its
// single series.
func instantQuery(base, query string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/query?query="+url.QueryEscape(query), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", err
	}
	if body.Status != "success" || body.Data.ResultType != "vector" || len(body.Data.Result) != 1 {
		return "", fmt.Errorf("status %s, %s with %d series", body.Status, body.Data.ResultType, len(body.Data.Result))
	}
	v, ok := body.Data.Result[0].Value[1].(string)
	if !ok {
		return "", fmt.Errorf("value %v is not a string", body.Data.Result[0].Value[1])
	}
	return v, nil
}
