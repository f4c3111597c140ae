package receiver

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/cgroupv1"
	"github.com/tetherdev/tether/receiver/wire"
)

// TestGrantLimitsEnforcedOrRefused: a grant whose resource limit this
// computer does not enforce at least as tightly starts nothing (denied,
// naming the limit); one it does enforce runs.
func TestGrantLimitsEnforcedOrRefused(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{Log: discardLogger()})
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil || nofile.Max == unix.RLIM_INFINITY {
		t.Fatalf("RLIMIT_NOFILE %+v %v: the test needs a finite hard limit", nofile, err)
	}
	for _, c := range []struct {
		name string
		set  func(*admission.Limits)
		want errcode.Code
	}{
		{"open files below RLIMIT_NOFILE", func(l *admission.Limits) { l.MaxOpenFiles = int64(nofile.Max) - 1 }, errcode.CodeDenied},
		{"open files at RLIMIT_NOFILE", func(l *admission.Limits) { l.MaxOpenFiles = int64(nofile.Max) }, ""},
		{"disk smaller than the root's file system", func(l *admission.Limits) { l.MaxDiskBytes = 1 << 20 }, errcode.CodeDenied},
		{"disk larger than the root's file system", func(l *admission.Limits) { l.MaxDiskBytes = 1 << 62 }, ""},
		{"pids without a pids cgroup", func(l *admission.Limits) { l.MaxPids = 1 << 40 }, errcode.CodeDenied},
		{"memory without a memory cgroup", func(l *admission.Limits) { l.MaxMemoryBytes = 1 << 60 }, errcode.CodeDenied},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := f.grant
			c.set(&g.Limits)
			f.publish(g)
			res, err := f.call(g, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}})
			if code(err) != c.want {
				t.Fatalf("exec_start: %v, want code %q", err, c.want)
			}
			if err == nil {
				f.wait(g, res.(*wire.ExecStartResult).TerminalID)
			} else if !strings.Contains(err.Error(), "not enforced by this computer") {
				t.Fatalf("refusal does not name the check: %v", err)
			}
		})
	}
}

// TestIntegrationCgroupV1Limits: with cgroup v1 hierarchies configured,
// a command starts inside the pids and memory cgroups whose limits the
// grant's max_pids and max_memory_bytes are checked against.
func TestIntegrationCgroupV1Limits(t *testing.T) {
	testenv.Require(t, "root", "cgroup-v1")
	var v1 []CgroupV1Config
	for _, c := range []string{cgroupv1.Pids, cgroupv1.Memory} {
		own, err := cgroupv1.Dir(c)
		if err != nil {
			t.Fatal(err)
		}
		v1 = append(v1, CgroupV1Config{Commands: testCgroupV1(t, own), Receiver: own})
	}
	write := func(p, v string) {
		if err := os.WriteFile(p, []byte(v), 0); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(v1[0].Commands, "pids.max"), "100")
	write(filepath.Join(v1[1].Commands, "memory.limit_in_bytes"), strconv.Itoa(64<<20))
	if _, err := os.Stat(filepath.Join(v1[1].Commands, "memory.memsw.limit_in_bytes")); err == nil {
		write(filepath.Join(v1[1].Commands, "memory.memsw.limit_in_bytes"), strconv.Itoa(64<<20))
	}
	var saved unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &saved); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: 100, Max: 100}); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NPROC, &saved)
	f := newFixture(t, Options{Log: discardLogger(), Cgroup: CgroupConfig{V1: v1}})
	g := f.grant
	g.Limits.MaxPids, g.Limits.MaxMemoryBytes = 100, 64<<20
	f.publish(g)
	id := f.start(g, wire.ExecStartArgs{Argv: []string{"/bin/cat", "/proc/self/cgroup"}})
	f.wait(g, id)
	out := f.output(g, id).Output
	for _, d := range v1 {
		if !strings.Contains(out, "/"+filepath.Base(d.Commands)+"\n") {
			t.Fatalf("command's cgroups %q lack %s", out, d.Commands)
		}
	}
	g.Limits.MaxPids = 99 // tighter than pids.max and RLIMIT_NPROC: refused
	f.publish(g)
	if _, err := f.call(g, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}}); code(err) != errcode.CodeDenied {
		t.Fatalf("grant tighter than the computer: %v, want denied", err)
	}
}

// testCgroupV1 makes a fresh cgroup beneath the v1 cgroup own, removed
// at the end of the test.
func testCgroupV1(t *testing.T, own string) string {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	d := filepath.Join(own, "tether-rtest-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(d) })
	return d
}

// BenchmarkEnforcementCheck is what checking a grant's five resource
// limits costs every exec_start: three getrlimit, a statfs and the
// pids and memory limit files of the commands' cgroups.
func BenchmarkEnforcementCheck(b *testing.B) {
	dir := b.TempDir()
	for f, v := range map[string]string{"pids.max": "256", "memory.limit_in_bytes": "1073741824"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v+"\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	e := enforcement{v1: []string{dir}}
	g := admission.Grant{Tuple: admission.Tuple{Root: dir}, Limits: admission.Limits{MaxPids: 1 << 40, MaxMemoryBytes: 1 << 40,
		MaxDiskBytes: 1 << 62, MaxOpenFiles: 1 << 40, MaxFileSizeBytes: 1 << 62}}
	for _, r := range []struct {
		res int
		lim *int64
	}{{unix.RLIMIT_NPROC, &g.Limits.MaxPids}, {unix.RLIMIT_FSIZE, &g.Limits.MaxFileSizeBytes}} {
		var rl unix.Rlimit
		if unix.Getrlimit(r.res, &rl); rl.Max == unix.RLIM_INFINITY {
			*r.lim = 0 // unlimited here would refuse it early; the other limits are still read
		}
	}
	for b.Loop() {
		_ = e.check(g)
	}
}
