package cgroup2_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/cgroup2"
)

// TestIntegrationCheckSweepsLeftoverProbes: a probe cgroup a killed
// Check left (empty, older than StaleProbe) is removed by the next Check;
// a fresh probe (a Check under way), one with a child cgroup, and a
// cgroup whose name only resembles a probe's are left as they are.
func TestIntegrationCheckSweepsLeftoverProbes(t *testing.T) {
	testenv.Require(t, "root", "cgroup2")
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * cgroup2.StaleProbe)
	mk := func(name string, at time.Time) string {
		p := filepath.Join(mount, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(filepath.Join(p, "child")); os.Remove(p) })
		if !at.IsZero() {
			if err := os.Chtimes(p, at, at); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	stale := mk(cgroup2.ProbePrefix+"00112233445566aa", old)
	fresh := mk(cgroup2.ProbePrefix+"00112233445566bb", time.Time{})
	busy := mk(cgroup2.ProbePrefix+"00112233445566cc", time.Time{})
	if err := os.Mkdir(filepath.Join(busy, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(busy, old, old); err != nil {
		t.Fatal(err)
	}
	other := mk(cgroup2.ProbePrefix+"not-a-probe-name", old)

	if err := cgroup2.Check(mount); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale empty probe %s is still there (%v)", stale, err)
	}
	for _, p := range []string{fresh, busy, other} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s was removed (%v); only a stale empty probe may be", p, err)
		}
	}
	// The control, in a cgroup of its own (a sweep of the whole mount
	// dated later would take other processes' probes under way): two
	// StaleProbes later the same fresh probe is swept, so the age bound is
	// what spares a Check under way.
	own := mk("tether-sweeptest-"+filepath.Base(t.TempDir()), time.Time{})
	probe := filepath.Join(own, cgroup2.ProbePrefix+"00112233445566dd")
	if err := os.Mkdir(probe, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(probe) })
	if got := cgroup2.SweepProbes(own, time.Now()); len(got) != 0 {
		t.Errorf("a sweep now removed %v, want nothing", got)
	}
	if got := cgroup2.SweepProbes(own, time.Now().Add(2*cgroup2.StaleProbe)); !slices.Equal(got, []string{probe}) {
		t.Errorf("a sweep two StaleProbes later removed %v, want %s", got, probe)
	}
}
