//go:build vmsuite

package nativesuite

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/chain"
	"github.com/tetherdev/tether/fixtures/computer"
	"github.com/tetherdev/tether/fixtures/e2e"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/fixtures/vmcomputer"
)

// VMComputer is the e2e Factory of a computer whose receiver runs in a
// QEMU guest.
func VMComputer(t *testing.T, b bins.Set, o computer.Options) computer.Computer {
	t.Helper()
	return newVM(t, b, o)
}

func newVM(t *testing.T, b bins.Set, o computer.Options) *vmcomputer.VM {
	t.Helper()
	testenv.Require(t, "root", "qemu")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o.Dir, o.Bins = filepath.Join(e2e.BaseDir(t), "vm"), b
	v, err := vmcomputer.New(ctx, o, vmcomputer.Options{})
	if err != nil {
		t.Fatalf("allocate a VM computer: %v", err)
	}
	t.Cleanup(func() {
		if err := v.Close(context.Background()); err != nil {
			t.Errorf("VM computer teardown: %v", err)
		}
	})
	return v
}

// TestNativePipeline: the whole end-to-end pipeline, each subtest on its
// own VM computer.
func TestNativePipeline(t *testing.T) { e2e.RunPipeline(t, VMComputer) }

// TestNativeRepublishSeenAtNextRequest: the coordinator's publisher
// revokes and renews the grant on the host; the guest's inotify sees
// nothing on the share, yet the receiver refuses the very next request
// and serves again after the renewal (and a reattach, which lifts the
// custodian's fence). Commands report the guest's kernel, so they ran in
// the VM.
func TestNativeRepublishSeenAtNextRequest(t *testing.T) {
	b := e2e.ChainBins(t)
	v := newVM(t, b, computer.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ch, err := chain.Start(ctx, chain.Options{Bins: b, Computer: v, StateDir: filepath.Join(e2e.BaseDir(t), "state"),
		AttachTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	a, err := ch.NewAgent(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := a.Bind(ctx, v.Tuple(), v.Grant().NotAfter)
	if err != nil {
		t.Fatal(err)
	}
	turn := run(t, ctx, a, sid, `run_command {"command":"/bin/uname","args":["-r"]}`)
	if out, _ := turn.Results[0].Output["output"].(string); strings.TrimSpace(out) != v.Release() || v.Release() == hostRelease(t) {
		t.Fatalf("uname -r printed %q; the guest runs %q and the host %q", out, v.Release(), hostRelease(t))
	}
	revoked := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, err := computer.Revoke(ctx, v)
		revoked <- err
	}()
	events, err := v.WatchAdmission(ctx, 2*time.Second)
	if err != nil || <-revoked != nil {
		t.Fatalf("watch: %v", err)
	}
	if events != 0 {
		t.Fatalf("%d inotify events on the 9p share: this test would not isolate request-time refresh", events)
	}
	turn = run(t, ctx, a, sid, `write_text_file {"path":"after-revoke.txt","content":"x"}`)
	if !turn.Results[0].Failed("not_admitted") {
		t.Fatalf("the first request after the revocation: %v, want not_admitted", turn.Results[0])
	}
	if _, err := v.Stat(ctx, "after-revoke.txt"); err == nil {
		t.Fatal("a write ran after the revocation")
	}
	if _, err := computer.Renew(ctx, v, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := a.Load(ctx, sid, v.Tuple(), v.Grant().NotAfter); err != nil {
		t.Fatalf("reattach after the renewal: %v", err)
	}
	turn = run(t, ctx, a, sid, `write_text_file {"path":"after-renew.txt","content":"x"}`)
	if turn.Results[0].Status != "completed" {
		t.Fatalf("after the renewal: %v", turn.Results[0])
	}
	if fi, err := v.Stat(ctx, "after-renew.txt"); err != nil || fi.UID != v.Grant().UID {
		t.Fatalf("after-renew.txt in the guest: %+v %v", fi, err)
	}
}

func run(t *testing.T, ctx context.Context, a *chain.Agent, sid acp.SessionId, lines ...string) chain.Turn {
	t.Helper()
	turn, err := a.Run(ctx, sid, lines...)
	if err != nil {
		t.Fatal(err)
	}
	return turn
}

func hostRelease(t *testing.T) string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
