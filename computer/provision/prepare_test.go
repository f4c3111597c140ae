package provision

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/cgroup2"
	"github.com/tetherdev/tether/receiver/cgroupv1"
)

// TestConcurrentlyJoinsAndNames: a failing group cancels the others'
// context, the step returns only once every group has ended, and the
// error names the failed step.
func TestConcurrentlyJoinsAndNames(t *testing.T) {
	boom := errors.New("boom")
	var ended bool
	s := Concurrently("both",
		[]Step{{Name: "a.Wait", Run: func(ctx context.Context) error {
			<-ctx.Done() // only the other group's failure ends this
			time.Sleep(10 * time.Millisecond)
			ended = true
			return ctx.Err()
		}}},
		[]Step{{Name: "b.Ok", Run: func(context.Context) error { return nil }},
			{Name: "b.Fail", Run: func(context.Context) error { return boom }},
			{Name: "b.Never", Run: func(context.Context) error { t.Error("a step after a failure ran"); return nil }}},
	)
	err := s.Run(ctxT(t, time.Minute))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "b.Fail: boom") || !strings.Contains(err.Error(), "a.Wait: ") {
		t.Fatalf("error %v, want b.Fail's boom and a.Wait's cancellation named", err)
	}
	if !ended {
		t.Fatal("Concurrently returned before every group ended")
	}
}

// TestStageJoinThreadChecksTheMove: a join the tasks file does not then
// list (here a plain file, which takes the write and lists nothing) is
// refused, so a receiver outside its cgroups is never started; the
// control is the prepared computer's receiver, which is in them
// (TestIntegrationPreparedReceiverInItsCgroups).
func TestStageJoinThreadChecksTheMove(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tasks"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := stageJoinThread([]string{filepath.Join(dir, "cgroup.procs")})
	if err == nil || !strings.Contains(err.Error(), "is not in") {
		t.Fatalf("join into a file that lists nothing: %v, want the thread named as not in it", err)
	}
}

// TestIntegrationPreparedReceiverInItsCgroups: the receiver of a prepared
// computer, whose stage moved only its thread, is in each of its v1
// cgroups' receiver/ (as a whole process: cgroup.procs lists it), and
// no other process is; with a cgroup2 parent the limits are there.
func TestIntegrationPreparedReceiverInItsCgroups(t *testing.T) {
	m := prepare(t, NewProvisioner(Config{Bins: receiverBins(t)}))
	s := m.Local().State()
	if len(s.LimitCgroups) == 0 {
		if s.CgroupParent == "" {
			t.Fatal("the computer has neither v1 limit cgroups nor a cgroup2 parent")
		}
		if err := cgroup2.HasControllers(filepath.Dir(s.CgroupParent), "pids", "memory"); err != nil {
			t.Fatalf("no v1 limit cgroups, and the cgroup2 parent cannot hold the limits: %v", err)
		}
		return
	}
	for _, d := range s.LimitCgroups {
		procs, err := cgroupv1.Procs(filepath.Join(d, "receiver"))
		if err != nil || !slices.Equal(procs, []int{s.ReceiverPID}) {
			t.Errorf("%s/receiver holds %v (%v), want the receiver %d alone", d, procs, err, s.ReceiverPID)
		}
		if procs, err := cgroupv1.Procs(filepath.Join(d, "commands")); err != nil || len(procs) != 0 {
			t.Errorf("%s/commands holds %v (%v), want nothing", d, procs, err)
		}
	}
}

// TestUIDInUseAgreesWithProcessesOf: FreshID's check finds every uid
// ProcessesOf finds, and not a uid no process has.
func TestUIDInUseAgreesWithProcessesOf(t *testing.T) {
	all, err := AllProcesses()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range all {
		if used, err := uidInUse(p.UID); err != nil || !used {
			t.Errorf("uid %d of process %d: in use %v (%v), want true", p.UID, p.HostPID, used, err)
		}
	}
	id, err := FreshID()
	if err != nil {
		t.Fatal(err)
	}
	if ps, _ := ProcessesOf(id); len(ps) != 0 {
		t.Fatalf("FreshID gave %d, which %d processes use", id, len(ps))
	}
	if used, err := uidInUse(id); err != nil || used {
		t.Errorf("uid %d that no process has: in use %v (%v)", id, used, err)
	}
}

// FuzzParseStatus: any status text gives a process without a panic, its
// uid 0 or one of the first three ids of a Uid line.
func FuzzParseStatus(f *testing.F) {
	f.Add([]byte("Name:\tsh\nPPid:\t1\nUid:\t0\t61234\t61234\t61234\nNSpid:\t40\t1\n"))
	f.Add([]byte("Uid:\t\nUid: x 5\nNSpid:\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := parseStatus(7, data)
		if p.UID == 0 {
			return
		}
		for _, line := range strings.Split(string(data), "\n") {
			k, v, ok := strings.Cut(line, ":")
			ids := strings.Fields(v)
			if ok && k == "Uid" && slices.ContainsFunc(ids[:min(3, len(ids))], func(f string) bool {
				u, err := strconv.ParseUint(f, 10, 32)
				return err == nil && uint32(u) == p.UID
			}) {
				return
			}
		}
		t.Fatalf("uid %d is on no Uid line", p.UID)
	})
}

// TestIntegrationPidsOfFindsAProcessOfTheUID: a process running as a
// fresh uid is what pidsOf lists for it, as ProcessesOf does, and
// nothing once it is gone (the teardown's checks rely on both).
func TestIntegrationPidsOfFindsAProcessOfTheUID(t *testing.T) {
	testenv.Require(t, "root")
	id, err := FreshID()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	got, err := pidsOf(id, false)
	if err != nil || !slices.Equal(got, []int{cmd.Process.Pid}) {
		t.Fatalf("pidsOf(%d) = %v, %v; want [%d]", id, got, err, cmd.Process.Pid)
	}
	if ps, _ := ProcessesOf(id); len(ps) != 1 || ps[0].HostPID != cmd.Process.Pid {
		t.Fatalf("ProcessesOf(%d) = %+v, want the one process", id, ps)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if got, err := pidsOf(id, false); err != nil || len(got) != 0 {
		t.Fatalf("pidsOf(%d) after the process ended = %v, %v", id, got, err)
	}
}

// BenchmarkScanUID times one check for a uid no process has, as
// teardown and NothingLeft make it once per computer: pidsOf (each
// process's status) against ProcessesOf (status and command line), over
// this host's /proc; both grow with the number of processes, which a
// fleet of computers raises by one receiver each.
func BenchmarkScanUID(b *testing.B) {
	id, err := FreshID()
	if err != nil {
		b.Fatal(err)
	}
	all, err := AllProcesses()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("ProcessesOf", func(b *testing.B) {
		for b.Loop() {
			if ps, err := ProcessesOf(id); err != nil || len(ps) != 0 {
				b.Fatalf("%d processes of uid %d (%v)", len(ps), id, err)
			}
		}
		b.ReportMetric(float64(len(all)), "processes")
	})
	b.Run("pidsOf", func(b *testing.B) {
		for b.Loop() {
			if ps, err := pidsOf(id, false); err != nil || len(ps) != 0 {
				b.Fatalf("%d processes of uid %d (%v)", len(ps), id, err)
			}
		}
		b.ReportMetric(float64(len(all)), "processes")
	})
}

// TestIntegrationPreparedFailureLeavesNothing: a prepared computer whose
// disk cannot be made (a petabyte is not on this host) fails naming the
// step, after the stage was started meanwhile; the undo leaves no
// directory, no mount beneath it and no stage.
func TestIntegrationPreparedFailureLeavesNothing(t *testing.T) {
	p := NewProvisioner(Config{Bins: receiverBins(t)})
	dir := filepath.Join(base(t), "computer")
	_, err := p.Prepare(ctxT(t, 2*time.Minute), dir, api.Limits{DiskBytes: 1 << 50})
	if err == nil || !strings.Contains(err.Error(), "disk.Image") {
		t.Fatalf("Prepare with a petabyte disk: %v, want the disk.Image step named", err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the computer's directory is left (%v)", err)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mi), " "+dir+"/") {
		t.Errorf("a mount beneath %s is left (%v)", dir, err)
	}
	exe, _ := os.Executable()
	all, _ := AllProcesses()
	for _, pr := range all {
		if pr.PPID == os.Getpid() && slices.Equal(pr.Cmdline, []string{exe, StageArg}) {
			t.Errorf("the stage %d is left", pr.HostPID)
		}
	}
}
