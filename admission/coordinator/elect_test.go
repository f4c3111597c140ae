package coordinator_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/coordinator"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/fixtures/etcdtest"
)

// helperConfigEnv makes the test binary a coordinator process: it runs
// coordinator.New(LoadConfig(path)).Run, printing one line per round
// published, until it is killed.
const helperConfigEnv = "COORDINATOR_HELPER_CONFIG"

func TestMain(m *testing.M) {
	if path := os.Getenv(helperConfigEnv); path != "" {
		os.Exit(coordinatorHelper(path))
	}
	os.Exit(m.Run())
}

func coordinatorHelper(path string) int {
	cfg, err := coordinator.LoadConfig(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer c.Close()
	_ = c.Run(context.Background(), func(r coordinator.Round, err error) {
		if err == nil {
			fmt.Printf("published %d %d\n", r.Leader, r.Published.Generation)
		}
	})
	return 0
}

// coordProc is a coordinator process and the rounds it reported.
type coordProc struct {
	cmd    *exec.Cmd
	rounds chan [2]uint64 // leader revision, generation
}

func startCoordinator(t *testing.T, cfgPath string) *coordProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperConfigEnv+"="+cfgPath)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &coordProc{cmd: cmd, rounds: make(chan [2]uint64, 1024)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 3 && f[0] == "published" {
				l, _ := strconv.ParseUint(f[1], 10, 64)
				g, _ := strconv.ParseUint(f[2], 10, 64)
				p.rounds <- [2]uint64{l, g}
			}
		}
		cmd.Wait()
		close(p.rounds)
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	return p
}

// next waits for the process's next published round.
func (p *coordProc) next(t *testing.T, within time.Duration) ([2]uint64, bool) {
	select {
	case r, ok := <-p.rounds:
		return r, ok
	case <-time.After(within):
		return [2]uint64{}, false
	}
}

// TestIntegrationTwoCoordinatorsOneLeader runs two coordinator processes
// (coordinator.New from a config with an etcd section, as tether-admission
// coordinate does) against one OpenBao stand-in, one admission directory
// and a real 3-member etcd cluster:
//   - exactly one publishes, and only it renews (every OpenBao call is
//     one of its rounds);
//   - SIGKILL of the leader moves publishing to the other within the
//     session TTL (plus one round interval);
//   - the killed leader's revision, used late by a coordinator that still
//     believes it leads, is refused by the publisher (ErrDeposed) and
//     changes nothing.
func TestIntegrationTwoCoordinatorsOneLeader(t *testing.T) {
	cluster := etcdtest.Start(t, etcdtest.Options{})
	far := time.Now().Add(24 * time.Hour)
	f := newFixture(t, coordinator.RenewToken, 3600, admission.PublishInput{NotAfter: far,
		Grants: []admission.Grant{grant(1, far)}})
	const ttl = 2
	cfgFor := func(name string) string {
		cfg := f.cfg
		cfg.IntervalS = 1
		cfg.Etcd = &coordinator.EtcdConfig{Endpoints: cluster.Endpoints(), Prefix: "/test/" + t.Name() + "/",
			Name: name, SessionTTLS: ttl}
		path := filepath.Join(f.dir, name+".json")
		writeJSONFile(t, path, cfg, 0o644)
		return path
	}
	a := startCoordinator(t, cfgFor("coordinator-a"))
	ra, ok := a.next(t, 30*time.Second)
	if !ok {
		t.Fatal("the first coordinator never published")
	}
	b := startCoordinator(t, cfgFor("coordinator-b"))
	aRounds := 1
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := a.next(t, time.Until(deadline)); ok {
			aRounds++
		}
	}
	if r, ok := b.next(t, 0); ok {
		t.Fatalf("the second coordinator published %v while the first leads", r)
	}
	killed := time.Now()
	a.cmd.Process.Signal(syscall.SIGKILL)
	calls := f.bao.Calls()
	for range a.rounds { // rounds it reported before it died
		aRounds++
	}
	// Each of the leader's rounds renewed once; one more renewal may be a
	// round the kill cut before its publish. A follower renewing every
	// second would add several.
	if calls < aRounds || calls > aRounds+1 || aRounds < 3 {
		t.Fatalf("OpenBao saw %d renewals for the leader's %d rounds: a follower renewed", calls, aRounds)
	}
	rb, ok := b.next(t, 30*time.Second)
	took := time.Since(killed)
	if !ok {
		t.Fatal("publishing never moved to the second coordinator")
	}
	t.Logf("failover %s after SIGKILL (session TTL %ds, interval 1s)", took, ttl)
	if took > (ttl+1+2)*time.Second {
		t.Errorf("failover took %s, session TTL %ds", took, ttl)
	}
	if rb[0] <= ra[0] {
		t.Fatalf("new leader revision %d is not above the old %d", rb[0], ra[0])
	}
	checkDeposedRefused(t, f, ra[0])
}

// checkDeposedRefused publishes as the deposed leader with its old
// revision: refused, the file unchanged.
func checkDeposedRefused(t *testing.T, f *fixture, deposed uint64) {
	before := f.fileBytes()
	c := f.coordinator(t)
	_, err := c.RunOnceAsLeader(context.Background(), deposed)
	if !errors.Is(err, signedfile.ErrDeposed) {
		t.Fatalf("the deposed leader's late publish: %v, want ErrDeposed", err)
	}
	if after := f.fileBytes(); after != before {
		t.Fatal("a deposed leader's publish changed the admission file")
	}
}

// TestEtcdConfigRefuses: the etcd section is checked like the OpenBao one:
// plain http only to loopback, https only with a pinned CA, a name, and a
// client certificate with its key.
func TestEtcdConfigRefuses(t *testing.T) {
	ok := coordinator.EtcdConfig{Endpoints: []string{"http://127.0.0.1:2379"}, Name: "c1"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("loopback http: %v", err)
	}
	for name, e := range map[string]coordinator.EtcdConfig{
		"no endpoints":     {Name: "c1"},
		"no name":          {Endpoints: []string{"http://127.0.0.1:2379"}},
		"remote http":      {Endpoints: []string{"http://10.0.0.5:2379"}, Name: "c1"},
		"https without CA": {Endpoints: []string{"https://etcd.internal:2379"}, Name: "c1"},
		"cert without key": {Endpoints: []string{"https://etcd.internal:2379"}, Name: "c1", CACert: "/ca", CertFile: "/c"},
		"negative ttl":     {Endpoints: []string{"http://127.0.0.1:2379"}, Name: "c1", SessionTTLS: -1},
		"not a url":        {Endpoints: []string{"127.0.0.1:2379"}, Name: "c1"},
		"unknown scheme":   {Endpoints: []string{"unix:///run/etcd.sock"}, Name: "c1"},
	} {
		if err := e.Validate(); !errors.Is(err, coordinator.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
