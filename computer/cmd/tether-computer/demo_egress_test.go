package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationDemoEgress is the egress step of `make demo`: inside a
// computer, curl fetches the allowed name's page and gets the proxy's
// 403 for the denied one, whose refusal shows in the computer's
// refusals file; the egress log verifies; and the lab network is gone
// afterwards (no address of its range on the host, its claim free).
func TestIntegrationDemoEgress(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "cgroup-freezer", "loop", "devtools")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := exec.CommandContext(ctx, b.Path(bins.Computer), "demo", "--bin", b.Dir).CombinedOutput()
	if err != nil {
		t.Fatalf("tether-computer demo: %v\n%s", err, out)
	}
	t.Logf("the demo took %v", time.Since(start).Round(time.Millisecond))
	for _, want := range []string{
		"hello from " + demoAllowed + ", a web server in the demo's lab network",
		"HTTP/1.1 403 Forbidden by tether egress: no allow rule",
		`refused "` + demoDenied + `:80" check="policy"`,
		"egress log: 2 connections, hash chain verifies",
		"every step behaved as expected",
	} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`lab network (\S+/29) `).FindSubmatch(out)
	if m == nil {
		t.Fatalf("the demo names no lab network:\n%s", out)
	}
	prefix := netip.MustParsePrefix(string(m[1]))
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && prefix.Contains(p.Addr()) {
			t.Errorf("the host still has %s in the lab network's range %s", a, prefix)
		}
	}
	lock, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@tether-labnet/" + prefix.String(), Net: "unix"})
	if err != nil {
		t.Fatalf("the lab network's range %s is still claimed: %v", prefix, err)
	}
	lock.Close()
}
