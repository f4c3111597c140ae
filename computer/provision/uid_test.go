package provision

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestSubIDRanges: ids inside a subordinate range are taken, ids at its
// ends are not, and a malformed line is refused rather than ignored.
func TestSubIDRanges(t *testing.T) {
	dir := t.TempDir()
	subuid := filepath.Join(dir, "subuid")
	if err := os.WriteFile(subuid, []byte("# comment\nalice:100000:65536\n\nbob:60000:10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := subIDRanges(subuid, filepath.Join(dir, "absent"))
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[uint32]bool{99999: false, 100000: true, 165535: true, 165536: false, 60009: true, 60010: false} {
		if got := rs.contain(id); got != want {
			t.Errorf("contain(%d) = %v, want %v", id, got, want)
		}
	}
	if err := os.WriteFile(subuid, []byte("alice:100000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := subIDRanges(subuid); !errors.Is(err, ErrOptions) {
		t.Fatalf("malformed line: %v, want ErrOptions", err)
	}
	// FreshID never lands in a range that covers all it may pick but one.
	all := filepath.Join(dir, "all")
	if err := os.WriteFile(all, []byte("x:60000:4194304\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := subIDFiles
	subIDFiles = []string{all}
	defer func() { subIDFiles = old }()
	if id, err := FreshID(); err == nil {
		t.Fatalf("FreshID picked %d inside a subordinate range", id)
	}
}

// TestKillLeftoversOutrunsForks: a leftover that keeps forking is killed
// with all its children, however many appear between listing and kill.
func TestKillLeftoversOutrunsForks(t *testing.T) {
	testenv.Require(t, "root")
	uid, err := FreshID()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", "while :; do sleep 100 & done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}, Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()      // reap the shell; its sleepers are reparented
	t.Cleanup(func() { // a failing run must not leave the forker behind
		for range 500 {
			procs, _ := ProcessesOf(uid)
			if len(procs) == 0 {
				return
			}
			for _, p := range procs {
				_ = syscall.Kill(p.PID, syscall.SIGKILL)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	// Wait until the forker is forking (its shell and some sleepers), so
	// killLeftovers meets a tree that grows while it kills.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if procs, _ := ProcessesOf(uid); len(procs) >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the forker never forked")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := killLeftovers(ctx, uid); !errors.Is(err, ErrLeftover) {
		t.Fatalf("killLeftovers: %v, want ErrLeftover naming the killed processes", err)
	}
	deadline := time.Now().Add(10 * time.Second) // zombies of reparented sleepers are reaped by init
	for {
		procs, err := ProcessesOf(uid)
		if err != nil {
			t.Fatal(err)
		}
		if len(procs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d processes of uid %d left after killLeftovers", len(procs), uid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
