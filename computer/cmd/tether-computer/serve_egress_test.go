package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationServeEgress runs the shipped daemon with
// --egress-config: a computer made with a policy is attached to the
// proxy; a request from inside its network namespace to a name the
// policy does not allow is refused by the proxy, shows in the
// computer's refusal log and in the metrics; an unknown preset is
// refused; after the daemon stops, egress verify checks the log.
func TestIntegrationServeEgress(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer)
	if err != nil {
		t.Fatal(err)
	}
	dir := traversableDir(t, "tether-serve-egress-")
	conf := filepath.Join(dir, "egress.json")
	if err := os.WriteFile(conf, []byte(`{"presets":[{"name":"pypi","allow":[{"host":"pypi.org"}]}],"dns":"127.0.0.1:9"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, b, dir, "--pool", "0", "--egress-config", conf)
	cl := client.Unix(filepath.Join(dir, "api.sock"))
	comp, err := cl.Create(ctx, api.CreateRequest{Egress: policy.Policy{Presets: []string{"pypi"}}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cl.Egress(ctx, comp.ID)
	if err != nil || !info.Enabled || !info.Attached || info.RefusalLog != provision.RefusalLog {
		t.Fatalf("egress of the new computer: %+v, %v", info, err)
	}
	st, err := provision.ReadState(filepath.Join(dir, "state", "computers", comp.ID))
	if err != nil {
		t.Fatal(err)
	}
	// A client in the computer's network namespace (nsenter, as root)
	// asks the proxy for a name no rule allows.
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/proc/"+fmt.Sprint(st.ReceiverPID)+"/ns/net", "curl", "-s",
		"-o", "/dev/null", "-w", "%{http_code}", "-x", provision.ProxyURL, "http://blocked.example/").CombinedOutput()
	if err != nil || string(out) != "403" {
		t.Fatalf("curl through the proxy for a denied name: %v, %q; want 403", err, out)
	}
	logPath := fmt.Sprintf("/proc/%d/root%s", st.ReceiverPID, provision.RefusalLog)
	waitFile(t, logPath, `refused "blocked.example:80" check="policy"`)
	if m := scrape(ctx, t, filepath.Join(dir, "api.sock")); !strings.Contains(m,
		`tether_computer_egress_refusals_total{computer="`+comp.ID+`"} 1`) {
		t.Errorf("metrics lack the refusal:\n%s", m)
	}
	if _, err := cl.SetEgress(ctx, comp.ID, policy.Policy{Presets: []string{"nonesuch"}}); api.CodeOf(err) != api.CodeUnknownPreset {
		t.Errorf("unknown preset: %v", err)
	}
	if err := cl.Delete(ctx, comp.ID); err != nil {
		t.Fatal(err)
	}
	d.stop(t, syscall.SIGTERM)
	out, err = exec.CommandContext(ctx, b.Path(bins.Computer), "egress", "verify", filepath.Join(dir, "state", EgressLogFile)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "chain intact") || strings.Contains(string(out), " 0 records") {
		t.Fatalf("egress verify: %v\n%s", err, out)
	}
}

// waitFile waits (at most 10 s) until the file at path holds want: the
// proxy hands refusals to the service on its own goroutine.
func waitFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never held %q; it holds %q", path, want, b)
		}
		time.Sleep(20 * time.Millisecond) // a file another process appends to; no event to wait on
	}
}
