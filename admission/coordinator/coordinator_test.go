package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/coordinator"
	"github.com/tetherdev/tether/admission/coordinator/baotest"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/admission/signing"
)

const token = "s.tether-test-token"

type fixture struct {
	dir, adir string
	bao       *baotest.Server
	key       signing.PrivateKey
	cfg       coordinator.Config
	loader    *signedfile.Loader
}

func tuple(n int) admission.Tuple {
	return admission.Tuple{Owner: "alice", Allocation: "a1", Session: fmt.Sprintf("s%d", n), Workspace: "w1",
		Sandbox: "sb1", Generation: 1, Executor: "e1", Site: "local", Root: "/srv/tether/w1"}
}

func grant(n int, notAfter time.Time) admission.Grant {
	return admission.Grant{Tuple: tuple(n), UID: 60001, GID: 60001, Groups: []uint32{},
		Ops: []admission.Op{admission.OpRead}, Limits: admission.Limits{MaxProcs: 1, MaxRuntimeS: 1, MaxOutputBytes: 1, MaxFileBytes: 1},
		NotAfter: notAfter}
}

func writeJSONFile(t *testing.T, path string, v any, mode os.FileMode) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, mode)
}

// newFixture writes a key, a token file, a grants file and a config for
// mode, backed by a baotest server granting ttl seconds.
func newFixture(t *testing.T, mode string, ttl int, grants admission.PublishInput) *fixture {
	t.Helper()
	f := &fixture{dir: t.TempDir()}
	f.adir = filepath.Join(f.dir, "admission")
	os.Mkdir(f.adir, 0o755)
	var err error
	if f.key, err = signing.GenerateKey(); err != nil {
		t.Fatal(err)
	}
	if err := signing.WritePrivateKey(filepath.Join(f.dir, "admission.key"), f.key); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(f.dir, "token"), []byte(token+"\n"), 0o600)
	writeJSONFile(t, filepath.Join(f.dir, "grants.json"), grants, 0o644)
	e := baotest.Expect{Token: token, Mode: mode, Increment: 3600}
	if mode == coordinator.RenewLease {
		e.LeaseID = "database/creds/tether/abc123"
	}
	f.bao, err = baotest.NewServer(t, e, ttl)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := f.bao.WriteCACert(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	zero := 0
	f.cfg = coordinator.Config{
		OpenBao: coordinator.OpenBaoConfig{Address: f.bao.URL, TokenFile: "token", CACert: ca,
			Renew: mode, LeaseID: e.LeaseID, IncrementS: 3600, MaxRetries: &zero},
		Dir: "admission", Key: "admission.key", Grants: "grants.json", IntervalS: 60,
	}
	writeJSONFile(t, filepath.Join(f.dir, "coordinator.json"), f.cfg, 0o644)
	f.loader, err = signedfile.NewLoader(signedfile.LoaderConfig{Path: filepath.Join(f.adir, admission.FileName),
		PublicKey: f.key.Public(), OwnerUID: ptr(uint32(os.Geteuid()))})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func ptr[T any](v T) *T { return &v }

func (f *fixture) coordinator(t *testing.T) *coordinator.Coordinator {
	t.Helper()
	cfg, err := coordinator.LoadConfig(filepath.Join(f.dir, "coordinator.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) fileBytes() string {
	b, _ := os.ReadFile(filepath.Join(f.adir, admission.FileName))
	return string(b)
}

func TestRunOnceCapsGrantsAtRenewedLease(t *testing.T) {
	for _, mode := range []string{coordinator.RenewToken, coordinator.RenewLease} {
		t.Run(mode, func(t *testing.T) {
			now := time.Now()
			far, near := now.Add(24*time.Hour), now.Add(10*time.Minute)
			f := newFixture(t, mode, 1800, admission.PublishInput{NotAfter: far, Grants: []admission.Grant{grant(1, far), grant(2, near)}})
			f.bao.OnRenew(func() {
				if f.fileBytes() != "" {
					t.Errorf("a file was published before the lease was renewed")
				}
			})
			before := time.Now()
			r, err := f.coordinator(t).RunOnce(context.Background())
			after := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			if f.bao.Calls() != 1 || r.Published.Generation != 1 || r.Lease.Duration != 1800*time.Second {
				t.Fatalf("round = %+v after %d calls", r, f.bao.Calls())
			}
			ld, err := f.loader.Load(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			s := ld.Snapshot
			lo, hi := before.Add(1800*time.Second), after.Add(1800*time.Second)
			for what, got := range map[string]time.Time{"snapshot": s.NotAfter, "grant 1": s.Grants[0].NotAfter} {
				if got.Before(lo.Truncate(time.Second)) || got.After(hi) {
					t.Errorf("%s not_after %s, want the lease expiry in [%s, %s]", what, got, lo, hi)
				}
			}
			if !s.Grants[1].NotAfter.Equal(near) {
				t.Errorf("grant 2 not_after %s, want its own earlier %s", s.Grants[1].NotAfter, near)
			}
		})
	}
}

func TestRenewalFailurePublishesNothing(t *testing.T) {
	far := time.Now().Add(24 * time.Hour)
	f := newFixture(t, coordinator.RenewToken, 1800, admission.PublishInput{NotAfter: far, Grants: []admission.Grant{grant(1, far)}})
	c := f.coordinator(t)
	if _, err := c.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	published := f.fileBytes()

	f.bao.Fail(http.StatusForbidden, "permission denied")
	if _, err := c.RunOnce(context.Background()); !errors.Is(err, coordinator.ErrRenew) {
		t.Fatalf("revoked token: err = %v, want ErrRenew", err)
	}
	f.bao.SetTTL(0)
	if _, err := c.RunOnce(context.Background()); !errors.Is(err, coordinator.ErrRenew) || !errors.Is(err, coordinator.ErrNoLeaseTTL) {
		t.Fatalf("renewal with no TTL: err = %v, want ErrRenew and ErrNoLeaseTTL", err)
	}
	f.bao.Close()
	if _, err := c.RunOnce(context.Background()); !errors.Is(err, coordinator.ErrRenew) {
		t.Fatalf("server down: err = %v, want ErrRenew", err)
	}
	if f.fileBytes() != published {
		t.Fatal("a failed renewal changed the admission file")
	}
}

func TestRefusalsBeforeAnyRequest(t *testing.T) {
	far := time.Now().Add(24 * time.Hour)
	f := newFixture(t, coordinator.RenewToken, 1800, admission.PublishInput{NotAfter: far, Grants: []admission.Grant{grant(1, far)}})
	c := f.coordinator(t)

	os.Chmod(filepath.Join(f.dir, "token"), 0o640)
	if _, err := c.RunOnce(context.Background()); !errors.Is(err, coordinator.ErrRenew) || !strings.Contains(err.Error(), "token file") {
		t.Errorf("group-readable token file: err = %v", err)
	}
	os.Chmod(filepath.Join(f.dir, "token"), 0o600)

	gen := uint64(9)
	writeJSONFile(t, filepath.Join(f.dir, "grants.json"), admission.PublishInput{Generation: &gen, NotAfter: far}, 0o644)
	if _, err := c.RunOnce(context.Background()); !errors.Is(err, coordinator.ErrInput) {
		t.Errorf("grants with a generation: err = %v, want ErrInput", err)
	}
	os.WriteFile(filepath.Join(f.dir, "grants.json"), []byte(`{"not_after":"2099-01-01T00:00:00Z","grants":[],"x":1}`), 0o644)
	if _, err := c.RunOnce(context.Background()); !errors.Is(err, coordinator.ErrInput) {
		t.Errorf("grants with an unknown field: err = %v, want ErrInput", err)
	}
	if f.bao.Calls() != 0 {
		t.Fatalf("%d requests reached OpenBao; refused rounds must not renew", f.bao.Calls())
	}
	if f.fileBytes() != "" {
		t.Fatal("a refused round published")
	}
}

func TestLoadConfigRefuses(t *testing.T) {
	dir := t.TempDir()
	good := `{"openbao":{"address":"https://bao.example:8200","token_file":"t","renew":"token","increment_s":3600},
	"dir":"d","key":"k","grants":"g","interval_s":60}`
	p := filepath.Join(dir, "c.json")
	os.WriteFile(p, []byte(good), 0o644)
	cfg, err := coordinator.LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Dir != filepath.Join(dir, "d") || cfg.OpenBao.TokenFile != filepath.Join(dir, "t") {
		t.Fatalf("relative paths not resolved against the config's directory: %+v", cfg)
	}
	bad := map[string][2]string{
		"unknown field":      {`"interval_s":60`, `"interval_s":60,"insecure":true`},
		"plain http":         {`https://bao.example:8200`, `http://bao.example:8200`},
		"other scheme":       {`https://bao.example:8200`, `ftp://bao.example`},
		"no token file":      {`"token_file":"t",`, ``},
		"bad mode":           {`"renew":"token"`, `"renew":"both"`},
		"lease without id":   {`"renew":"token"`, `"renew":"lease"`},
		"token with id":      {`"renew":"token"`, `"renew":"token","lease_id":"x"`},
		"no increment":       {`"increment_s":3600`, `"increment_s":0`},
		"interval too long":  {`"interval_s":60`, `"interval_s":3600`},
		"no interval":        {`"interval_s":60`, `"interval_s":0`},
		"no grants":          {`"grants":"g",`, ``},
		"duplicate key":      {`"dir":"d"`, `"dir":"d","dir":"/etc"`},
		"negative retries":   {`"increment_s":3600`, `"increment_s":3600,"max_retries":-1`},
		"uppercase key":      {`"dir":"d"`, `"Dir":"d"`},
		"not a url":          {`https://bao.example:8200`, `bao.example`},
		"trailing data":      {`"interval_s":60}`, `"interval_s":60}{}`},
		"negative timeout_s": {`"increment_s":3600`, `"increment_s":3600,"timeout_s":-5`},
	}
	for name, m := range bad {
		os.WriteFile(p, []byte(strings.Replace(good, m[0], m[1], 1)), 0o644)
		if _, err := coordinator.LoadConfig(p); !errors.Is(err, coordinator.ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
	}
	os.WriteFile(p, []byte(strings.Replace(good, `https://bao.example:8200`, `http://127.0.0.1:8200`, 1)), 0o644)
	if _, err := coordinator.LoadConfig(p); err != nil {
		t.Errorf("http to loopback (a local agent) refused: %v", err)
	}
}

func TestRunRoundsUntilCancelled(t *testing.T) {
	far := time.Now().Add(24 * time.Hour)
	f := newFixture(t, coordinator.RenewToken, 1800, admission.PublishInput{NotAfter: far, Grants: []admission.Grant{grant(1, far)}})
	key, _ := signing.LoadPrivateKey(filepath.Join(f.dir, "admission.key"))
	pub, _ := signedfile.NewPublisher(signedfile.PublisherConfig{Dir: f.adir, Key: key})
	cfg, _ := coordinator.LoadConfig(filepath.Join(f.dir, "coordinator.json"))
	r, _ := coordinator.NewOpenBaoRenewer(cfg.OpenBao, nil)
	c, err := coordinator.NewWithOptions(coordinator.Options{Renewer: r, Publisher: pub,
		GrantsPath: cfg.Grants, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var gens []uint64 // report runs on Run's goroutine, one round at a time
	var failures []error
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(r coordinator.Round, err error) {
			if err != nil {
				failures = append(failures, err)
				if len(failures) == 2 {
					f.bao.SetTTL(1800) // OpenBao is back
				}
				return
			}
			gens = append(gens, r.Published.Generation)
			if len(gens) == 2 {
				f.bao.Fail(http.StatusForbidden, "permission denied")
			}
			if len(gens) == 3 {
				cancel()
			}
		})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not finish")
	}
	if len(gens) != 3 || gens[0] != 1 || gens[1] != 2 || gens[2] != 3 || len(failures) != 2 {
		t.Fatalf("generations %v, failures %v; want 1 2 3 with two failed rounds between 2 and 3", gens, failures)
	}
	for _, err := range failures {
		if !errors.Is(err, coordinator.ErrRenew) {
			t.Fatalf("failed round: %v, want ErrRenew", err)
		}
	}
}

// TestEnvironmentIgnored: BAO_*/VAULT_* variables must not change the
// address, the token or TLS verification; only the config file does.
func TestEnvironmentIgnored(t *testing.T) {
	for _, prefix := range []string{"BAO_", "VAULT_"} {
		t.Setenv(prefix+"ADDR", "https://203.0.113.1:8200")
		t.Setenv(prefix+"TOKEN", "s.from-the-environment")
		t.Setenv(prefix+"SKIP_VERIFY", "true")
		t.Setenv(prefix+"NAMESPACE", "elsewhere")
		t.Setenv(prefix+"MAX_RETRIES", "9")
	}
	far := time.Now().Add(24 * time.Hour)
	f := newFixture(t, coordinator.RenewToken, 1800, admission.PublishInput{NotAfter: far, Grants: []admission.Grant{grant(1, far)}})
	if _, err := f.coordinator(t).RunOnce(context.Background()); err != nil {
		t.Fatalf("RunOnce with hostile environment: %v", err)
	}
	if f.bao.Calls() != 1 {
		t.Fatalf("%d requests reached the configured server, want 1", f.bao.Calls())
	}
}

// TestUnpinnedCARefused: without the CA file, the stand-in's self-signed
// certificate must not be trusted.
func TestUnpinnedCARefused(t *testing.T) {
	far := time.Now().Add(24 * time.Hour)
	f := newFixture(t, coordinator.RenewToken, 1800, admission.PublishInput{NotAfter: far, Grants: []admission.Grant{grant(1, far)}})
	f.cfg.OpenBao.CACert = ""
	writeJSONFile(t, filepath.Join(f.dir, "coordinator.json"), f.cfg, 0o644)
	if _, err := f.coordinator(t).RunOnce(context.Background()); !errors.Is(err, coordinator.ErrRenew) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("self-signed server without a pinned CA: err = %v, want a certificate failure", err)
	}
	if f.fileBytes() != "" {
		t.Fatal("published without a verified server")
	}
}
