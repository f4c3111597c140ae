package receiver

import (
	"errors"
	"strings"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
)

// seccompLines returns the Seccomp and Seccomp_filters lines of a
// /proc status text, joined.
func seccompLines(status string) string {
	var out []string
	for _, l := range strings.Split(status, "\n") {
		if strings.HasPrefix(l, "Seccomp:") || strings.HasPrefix(l, "Seccomp_filters:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, "; ")
}

// TestSeccompRequired: a handler with seccomp required runs each
// command under the filter (exactly one, mode 2), in thread mode and,
// with a required cgroup, in helper mode; util-linux unshare -U is
// refused. The same handler with seccomp off is the positive control.
func TestSeccompRequired(t *testing.T) {
	testenv.Require(t, "root")
	script := "grep Seccomp /proc/self/status; unshare -U -r true && echo USERNS"
	for _, c := range []struct {
		name    string
		opts    func(t *testing.T) Options
		seccomp string
		want    string
	}{
		{"thread", func(*testing.T) Options { return Options{} }, SeccompRequired, "Seccomp: 2; Seccomp_filters: 1"},
		{"helper-cgroup", func(t *testing.T) Options {
			return Options{SpawnMode: spawn.ModeHelper, Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: cgroupParent(t)}}
		}, SeccompRequired, "Seccomp: 2; Seccomp_filters: 1"},
		{"clone-cgroup", func(t *testing.T) Options {
			return Options{SpawnMode: spawn.ModeClone, Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: cgroupParent(t)}}
		}, SeccompRequired, "Seccomp: 2; Seccomp_filters: 1"},
		{"clone-cgroup-off", func(t *testing.T) Options {
			return Options{SpawnMode: spawn.ModeClone, Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: cgroupParent(t)}}
		}, SeccompOff, "Seccomp: 0; Seccomp_filters: 0"},
		{"off", func(*testing.T) Options { return Options{} }, SeccompOff, "Seccomp: 0; Seccomp_filters: 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts(t)
			opts.Seccomp = SeccompConfig{Mode: c.seccomp}
			f := newFixture(t, opts)
			id := f.start(f.grant, wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", script},
				Env: map[string]string{"PATH": "/usr/bin:/bin"}})
			f.wait(f.grant, id)
			out := f.output(f.grant, id).Output
			if got := seccompLines(out); got != c.want {
				t.Fatalf("%s (output %q), want %s", got, out, c.want)
			}
			if userns := strings.Contains(out, "USERNS"); userns != (c.seccomp == SeccompOff) {
				t.Fatalf("a user namespace was made: %v, output %q", userns, out)
			}
		})
	}
}

// TestSeccompOptionsRefused: an unknown mode, and thread mode with a
// required cgroup, are refused before anything starts.
func TestSeccompOptionsRefused(t *testing.T) {
	if _, err := NewHandler(Options{Grants: lyingSource{}, Seccomp: SeccompConfig{Mode: "best-effort"}}); !errors.Is(err, ErrOptions) {
		t.Fatalf("unknown mode: %v", err)
	}
	_, err := NewHandler(Options{Grants: lyingSource{}, Seccomp: SeccompConfig{Mode: SeccompRequired},
		Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: "/sys/fs/cgroup/nonexistent"}})
	if !errors.Is(err, ErrOptions) || !errors.Is(err, spawn.ErrSeccompThreadCgroup) {
		t.Fatalf("thread mode with a cgroup: %v", err)
	}
}

// TestSeccompConfigSpawnMode: with seccomp and cgroup required an absent
// spawn means clone where spawn.CloneSupported, else helper, and an
// explicit thread is refused; seccomp alone keeps thread.
func TestSeccompConfigSpawnMode(t *testing.T) {
	both := strings.Replace(goodConfig, `"spawn": "thread",`,
		`"seccomp": {"mode": "required"}, "cgroup": {"mode": "required", "parent": "/sys/fs/cgroup/tether"},`, 1)
	c, err := DecodeConfig([]byte(both))
	if err != nil {
		t.Fatal(err)
	}
	want := spawn.ModeHelper
	if spawn.CloneSupported() == nil {
		want = spawn.ModeClone
	}
	if m, _ := c.spawnMode(); m != want {
		t.Fatalf("spawn mode %v, want %v", m, want)
	}
	explicit := strings.Replace(both, `"seccomp"`, `"spawn": "thread", "seccomp"`, 1)
	if _, err := DecodeConfig([]byte(explicit)); !errors.Is(err, ErrConfig) || !errors.Is(err, spawn.ErrSeccompThreadCgroup) {
		t.Fatalf("explicit thread with both: %v", err)
	}
	alone := strings.Replace(goodConfig, `"spawn": "thread",`, `"spawn": "thread", "seccomp": {"mode": "required"},`, 1)
	if c, err = DecodeConfig([]byte(alone)); err != nil {
		t.Fatal(err)
	}
	if m, _ := c.spawnMode(); m != spawn.ModeThread {
		t.Fatalf("spawn mode %v, want thread", m)
	}
	if _, err := DecodeConfig([]byte(strings.Replace(alone, `"seccomp": {"mode": "required"}`, `"seccomp": {"mode": "on"}`, 1))); err == nil {
		t.Fatal("an unknown seccomp mode was accepted")
	}
}
