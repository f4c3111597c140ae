package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// daemonProc is one `tether-computer serve` process of a test.
type daemonProc struct {
	cmd  *exec.Cmd
	logs bytes.Buffer
	done chan error
}

// startDaemon runs the real binary on dir with args and waits until its
// socket answers /healthz.
func startDaemon(t *testing.T, b bins.Set, dir string, args ...string) *daemonProc {
	t.Helper()
	sock := filepath.Join(dir, "api.sock")
	argv := append([]string{"serve", "--dir", filepath.Join(dir, "state"), "--socket", sock, "--bin", b.Dir,
		"--memory", "268435456", "--disk", "134217728"}, args...)
	d := &daemonProc{cmd: exec.Command(b.Path(bins.Computer), argv...), done: make(chan error, 1)}
	d.cmd.Stdout, d.cmd.Stderr = &d.logs, &d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.stop(t, syscall.SIGTERM)
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.logs.String())
		}
	})
	cl := client.Unix(sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		if cl.Health(ctx) == nil {
			return d
		}
		select {
		case err := <-d.done:
			t.Fatalf("tether-computer serve exited: %v\n%s", err, d.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("tether-computer serve never answered /healthz\n%s", d.logs.String())
	return nil
}

// traversableDir is a temporary directory the computers' users can
// traverse (t.TempDir's parent is not), removed at the end.
func traversableDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stop sends sig and waits for the daemon to exit (once).
func (d *daemonProc) stop(t *testing.T, sig syscall.Signal) {
	if d.cmd.ProcessState != nil || d.done == nil {
		return
	}
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
		<-d.done
		t.Errorf("tether-computer serve did not stop on %v", sig)
	}
	d.done = nil
}

// TestIntegrationServe drives the shipped daemon as an operator would:
// a create served from the warm pool, a custodian run that asks the
// service for its computer and releases it, suspend and resume, the
// metrics an admin scrapes, a SIGKILLed daemon whose successor adopts
// the running computer, and a last start without a pool that leaves
// nothing of the pool behind; the transition log verifies throughout.
func TestIntegrationServe(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer, bins.Custodian, bins.Plugin, bins.HostAgent)
	if err != nil {
		t.Fatal(err)
	}
	dir := traversableDir(t, "tether-serve-")
	sock := filepath.Join(dir, "api.sock")
	cl := client.Unix(sock)
	d := startDaemon(t, b, dir, "--pool", "1")
	comp := waitPoolCreate(ctx, t, cl)
	ran := custodianRun(ctx, t, b, sock)
	checkRecords(ctx, t, b, cl, ran)

	if c, err := cl.Suspend(ctx, comp.ID); err != nil || c.State != api.StateSuspended {
		t.Fatalf("suspend: %v (state %q)", err, c.State)
	}
	if c, err := cl.Resume(ctx, comp.ID); err != nil || c.State != api.StateRunning {
		t.Fatalf("resume: %v (state %q)", err, c.State)
	}
	// A callback to a suspended computer wakes it: its custodian
	// configuration names the service, and the custodian resumes it first.
	if _, err := cl.Suspend(ctx, comp.ID); err != nil {
		t.Fatal(err)
	}
	runStart := time.Now()
	out, err := exec.CommandContext(ctx, b.Path(bins.Custodian), "run", "--config", comp.CustodianConfig, "--jail-exec", b.Path(bins.Plugin),
		"--prompt", `run_command {"command":"/bin/echo","args":["awake"]}`, "--", b.Path(bins.HostAgent), "--plugin", b.Path(bins.Plugin), "--principal", "alice").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(`awake\\n`)) {
		t.Fatalf("a run on the suspended computer: %v\n%s", err, out)
	}
	t.Logf("a run on the suspended computer took %v:\n%s", time.Since(runStart), out)
	if c, err := cl.Get(ctx, comp.ID); err != nil || c.State != api.StateRunning {
		t.Fatalf("after the run: %v (state %q)", err, c.State)
	}
	metrics := scrape(ctx, t, sock)
	for _, want := range []string{`tether_computers{state="running"} 1`, `tether_computer_pids{computer="` + comp.ID + `"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, metrics)
		}
	}

	d.stop(t, syscall.SIGKILL)
	d = startDaemon(t, b, dir, "--pool", "1")
	if c, err := cl.Get(ctx, comp.ID); err != nil || c.State != api.StateRunning {
		t.Fatalf("after a SIGKILLed daemon, the next one should adopt %s running: %v (state %q)\n%s", comp.ID, err, c.State, d.logs.String())
	}
	if err := cl.Delete(ctx, comp.ID); err != nil {
		t.Fatal(err)
	}
	d.stop(t, syscall.SIGTERM)
	d = startDaemon(t, b, dir, "--pool", "0")
	d.stop(t, syscall.SIGTERM)
	for _, sub := range []string{"pool", "computers"} {
		if ents, err := os.ReadDir(filepath.Join(dir, "state", sub)); err != nil || len(ents) != 0 {
			t.Errorf("state/%s after the last daemon: %d entries, %v", sub, len(ents), err)
		}
	}
	out, err = exec.CommandContext(ctx, b.Path(bins.Computer), "verify", "--dir", filepath.Join(dir, "state")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "chain intact") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}

// waitPoolCreate creates a computer and checks that it runs.
func waitPoolCreate(ctx context.Context, t *testing.T, cl *client.Client) api.Computer {
	t.Helper()
	comp, err := cl.Create(ctx, api.CreateRequest{LeaseTTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if comp.State != api.StateRunning || comp.CustodianConfig == "" {
		t.Fatalf("create: %+v", comp)
	}
	return comp
}

// custodianRun runs the host agent through tether-custodian on a
// computer the service makes for the run, checks the command ran there
// and the computer was deleted at the end, and returns its id.
func custodianRun(ctx context.Context, t *testing.T, b bins.Set, sock string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, b.Path(bins.Custodian), "run", "--computer-socket", sock, "--jail-exec", b.Path(bins.Plugin),
		"--prompt", `run_command {"command":"/bin/id"}`, "--", b.Path(bins.HostAgent), "--plugin", b.Path(bins.Plugin), "--principal", "alice")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tether-custodian run --computer-socket: %v\n%s", err, out)
	}
	for _, want := range []string{"from the service", `uid=`, "deleted computer"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("custodian run output lacks %q:\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`deleted computer (c-[0-9a-f]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("custodian run output names no deleted computer:\n%s", out)
	}
	return string(m[1])
}

// checkRecords checks that the receipts and the audit log of a deleted
// computer stay readable: its records hold the run's command, and the
// audit log verifies with the key kept beside it.
func checkRecords(ctx context.Context, t *testing.T, b bins.Set, cl *client.Client, id string) {
	t.Helper()
	c, err := cl.Get(ctx, id)
	if err != nil || c.State != api.StateDeleted || c.Records == "" {
		t.Fatalf("the deleted computer %s: %v (state %q, records %q)", id, err, c.State, c.Records)
	}
	state := filepath.Join(c.Records, "state")
	out, err := exec.CommandContext(ctx, b.Path(bins.Custodian), "receipts", "show", "--state", state).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(`/bin/id`)) {
		t.Errorf("receipts show of the deleted computer's records: %v\n%s", err, out)
	}
	out, err = exec.CommandContext(ctx, b.Path(bins.Custodian), "audit", "verify", "--state", state,
		"--pubkey", filepath.Join(c.Records, "audit.pub")).CombinedOutput()
	if err != nil {
		t.Errorf("audit verify of the deleted computer's records: %v\n%s", err, out)
	}
}

// scrape GETs /metrics over the socket, as root (an admin).
func scrape(ctx context.Context, t *testing.T, sock string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://tether-computer/metrics", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	return string(body)
}

// TestIntegrationDemo is the service half of `make demo`: the shipped
// binary's demo exits 0 having shown every step, and leaves no receiver
// running.
func TestIntegrationDemo(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "cgroup-freezer", "loop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, b.Path(bins.Computer), "demo", "--bin", b.Dir).CombinedOutput()
	if err != nil {
		t.Fatalf("tether-computer demo: %v\n%s", err, out)
	}
	for _, want := range []string{"claimed from the pool", "renewed", "resumed in", "expiring -> deleted", "every step behaved as expected"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
	dir := regexp.MustCompile(`(/\S*tether-computer-demo-\d+)/`).FindSubmatch(out)
	if dir == nil {
		t.Fatalf("the demo names no directory:\n%s", out)
	}
	if _, err := os.Stat(string(dir[1])); !os.IsNotExist(err) {
		t.Errorf("the demo left %s: %v", dir[1], err)
	}
	procs, _ := exec.CommandContext(ctx, "pgrep", "-f", string(dir[1])).Output()
	if len(bytes.TrimSpace(procs)) != 0 {
		t.Errorf("the demo left processes running on %s: %s", dir[1], procs)
	}
}
