package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/custodian"
)

// custodianDialer dials the receiver exactly as the custodian that reads
// the computer's custodian.json does.
type custodianDialer struct{ cfg *custodian.Config }

func (d custodianDialer) Dial(ctx context.Context) (io.ReadWriteCloser, error) {
	tr, err := d.cfg.Receiver.Transport(nil)
	if err != nil {
		return nil, err
	}
	return tr.Dial(ctx)
}

// openTierService opens a computer service in base/svc whose default
// tier is namespaced and whose vm tier is p. The caller closes it.
func openTierService(t *testing.T, ctx context.Context, p *Provisioner, base string) *service.Service {
	t.Helper()
	s, err := service.Open(ctx, service.Config{Dir: filepath.Join(base, "svc"),
		Provisioner:  provision.NewProvisioner(provision.Config{Bins: p.cfg.Bins}),
		Provisioners: map[string]api.Provisioner{api.TierVM: p}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestIntegrationVMServiceTier: a create with tier vm through the
// service gives a VM computer: the answer says the tier and the
// accelerator, a command runs through the custodian's configuration,
// suspend stops the guest and resume runs it, delete leaves nothing; a
// second computer whose QEMU is SIGKILLed is marked failed and leaves
// nothing either. It reports create -> first command under TCG.
func TestIntegrationVMServiceTier(t *testing.T) {
	p, base := testProvisioner(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := openTierService(t, ctx, p, base)
	defer s.Close()
	alice := api.Caller{Owner: "alice"}
	if _, err := s.Create(ctx, alice, api.CreateRequest{Tier: "bhyve"}); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("create with an unknown tier = %v, want bad_request", err)
	}
	start := time.Now()
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 192 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	d := dialerOf(t, c)
	if out := runVia(t, ctx, d, c.Tuple, "id -u"); strings.TrimSpace(out) == "" {
		t.Fatalf("no output from the first command")
	}
	t.Logf("BENCH create -> first command, TCG cold boot, through the service: %s", time.Since(start).Round(time.Millisecond))
	if got, _ := s.Get(ctx, alice, c.ID); got.Tier != api.TierVM || got.Accelerator != AccelTCG || got.Screen ||
		got.Transport != TransportVirtioSerial+" (--vm-transport serial)" {
		t.Fatalf("show says tier %q accelerator %q transport %q screen %v", got.Tier, got.Accelerator, got.Transport, got.Screen)
	}
	checkNoScreen(t, filepath.Join(base, "svc", "computers", c.ID))
	if _, err := s.Link(ctx, alice, c.ID, api.LinkRequest{Role: api.LinkRoleView}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("a link to a VM computer without a screen = %v, want conflict", err)
	}
	if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = provision.AttachVia(actx, d, *c.Tuple)
	acancel()
	if err == nil {
		t.Fatal("a suspended VM computer's receiver answered")
	}
	if _, err := s.Resume(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := provision.AttachVia(ctx, d, *c.Tuple); err != nil {
		t.Fatalf("attach after resume: %v", err)
	}
	st := vmState(t, filepath.Join(base, "svc", "computers", c.ID))
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	checkGone(t, p, filepath.Join(base, "svc", "computers", c.ID), st)

	// SIGKILL of QEMU: the computer is marked failed and nothing is left.
	c2, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM})
	if err != nil {
		t.Fatal(err)
	}
	dir2 := filepath.Join(base, "svc", "computers", c2.ID)
	st2 := vmState(t, dir2)
	if err := syscall.Kill(st2.QEMUPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got, _ := s.Get(ctx, alice, c2.ID)
		if got.State == api.StateFailed {
			t.Logf("after SIGKILL of QEMU: %s (%s)", got.State, got.Reason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after SIGKILL of QEMU the computer is %s", got.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkGone(t, p, dir2, st2)
}

func dialerOf(t *testing.T, c api.Computer) custodianDialer {
	t.Helper()
	cfg, err := custodian.LoadConfig(c.CustodianConfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tuple == nil {
		t.Fatal("running computer without a tuple")
	}
	return custodianDialer{cfg}
}

// runVia runs a shell line as the grant's uid through d.
func runVia(t *testing.T, ctx context.Context, d provision.Dialer, tu *admission.Tuple, line string) string {
	t.Helper()
	return execWith(t, ctx, d, *tu, "/bin/sh", "-c", line)
}

func vmState(t *testing.T, dir string) state {
	t.Helper()
	st, err := readState(dir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkGone: no directory (so no socket, image or log), no cgroup, no
// QEMU process.
func checkGone(t *testing.T, p *Provisioner, dir string, st state) {
	t.Helper()
	cg := cgroups{root: p.cgroupRoot(), name: st.Cgroup}
	if err := nothingLeft(dir, cg, st.QEMUPID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", st.QEMUPID)); !errors.Is(err, os.ErrNotExist) && !zombieOrGone(st.QEMUPID) {
		t.Fatalf("QEMU %d still runs", st.QEMUPID)
	}
}
