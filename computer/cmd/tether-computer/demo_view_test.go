package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/vm"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationDemoView is `make demo-view` on the product path: the
// embedded daemon creates a VM computer with a screen, prints a control
// and a view-only link on loopback, and waits; Ctrl-C (SIGINT, as the
// README ends it) ends the wait but not the daemon: the demo deletes the
// computer, verifies the view's audit log kept with its records (the two
// mints), and removes its directory.
func TestIntegrationDemoView(t *testing.T) {
	testenv.Require(t, "root", "qemu")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer, bins.VMGuest)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := interruptWhenWaiting(ctx, exec.CommandContext(ctx, b.Path(bins.Computer), "demo-view", "--bin", b.Dir), nil)
	if err != nil {
		t.Fatalf("tether-computer demo-view: %v\n%s", err, out)
	}
	t.Logf("the demo took %v", time.Since(start).Round(time.Millisecond))
	for _, re := range []string{
		`(?m)^  control:   http://127\.0\.0\.1:\d+/#t=\S+$`,
		`(?m)^  view only: http://127\.0\.0\.1:\d+/#t=\S+$`,
		`(?m)^Open a link in a browser on this machine\. Mint another with:\n  tether-computer link --socket /\S+/api\.sock --role view c-[0-9a-f]+$`,
		`audit log, kept with the records: 2 entries map\[token_mint:2\], head [0-9a-f]+: the hash chain holds`,
	} {
		if !regexp.MustCompile(re).Match(out) {
			t.Errorf("the demo's output lacks %s:\n%s", re, out)
		}
	}
	m := regexp.MustCompile(`API socket (\S+)\)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("the demo names no socket:\n%s", out)
	}
	if _, err := os.Stat(filepath.Dir(string(m[1]))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the demo's directory %s is left: %v", filepath.Dir(string(m[1])), err)
	}
	if bytes.Contains(out, []byte("FAILED")) {
		t.Errorf("the demo failed:\n%s", out)
	}
}

// interruptWhenWaiting runs cmd, calls before (if set) with what it
// printed so far once it prints that Ctrl-C ends the demo, then sends it
// SIGINT, and returns all it printed once it exits.
func interruptWhenWaiting(ctx context.Context, cmd *exec.Cmd, before func(out []byte) error) ([]byte, error) {
	return interruptAt(ctx, cmd, "Ctrl-C ends the demo.", before)
}

// interruptAt runs cmd, calls before (if set) with what it printed so
// far once it prints the line at, then sends it SIGINT, and returns all
// it printed once it exits. An error of before kills cmd.
func interruptAt(ctx context.Context, cmd *exec.Cmd, at string, before func(out []byte) error) ([]byte, error) {
	var out bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		out.Write(append(sc.Bytes(), '\n'))
		if sc.Text() != at {
			continue
		}
		if before != nil {
			if err := before(out.Bytes()); err != nil {
				cmd.Process.Kill()
				return out.Bytes(), err
			}
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			return out.Bytes(), err
		}
	}
	select {
	case err := <-exited:
		return out.Bytes(), err
	case <-ctx.Done():
		return out.Bytes(), ctx.Err()
	}
}

// vmFile is what a VM computer's vm.json says of its QEMU.
type vmFile struct {
	QEMUPID int    `json:"qemu_pid"`
	Cgroup  string `json:"cgroup"`
}

// demoDir is the demo's directory, from the socket it names.
func demoDir(out []byte) (string, error) {
	m := regexp.MustCompile(`API socket (\S+)\)`).FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("the demo names no socket:\n%s", out)
	}
	return filepath.Dir(string(m[1])), nil
}

// runningQEMU waits until the one computer under dir has a QEMU that
// runs, and returns its id and vm.json.
func runningQEMU(ctx context.Context, dir string) (string, vmFile, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		paths, _ := filepath.Glob(filepath.Join(dir, "state", "computers", "*", "vm.json"))
		var st vmFile
		if len(paths) == 1 {
			if data, err := os.ReadFile(paths[0]); err == nil && json.Unmarshal(data, &st) == nil && st.QEMUPID > 0 && running(st.QEMUPID) {
				return filepath.Base(filepath.Dir(paths[0])), st, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", vmFile{}, fmt.Errorf("no running QEMU under %s: %w", dir, ctx.Err())
		case <-tick.C:
		}
	}
}

// checkQEMUGone: QEMU's process and its cgroups are gone, read from the
// host.
func checkQEMUGone(t *testing.T, st vmFile) {
	t.Helper()
	if running(st.QEMUPID) {
		t.Errorf("QEMU (pid %d) still runs after the demo", st.QEMUPID)
	}
	for _, h := range []string{"memory", "pids", "cpuacct"} {
		if _, err := os.Lstat(filepath.Join("/sys/fs/cgroup", h, st.Cgroup)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("QEMU's %s cgroup %s is left: %v", h, st.Cgroup, err)
		}
	}
}

// wantFailed: the demo exited 1 and printed each of wants.
func wantFailed(t *testing.T, out []byte, err error, wants ...string) {
	t.Helper()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitFail {
		t.Fatalf("demo-view: %v, want exit %d\n%s", err, exitFail, out)
	}
	for _, want := range append([]string{"FAILED"}, wants...) {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
}

// TestIntegrationDemoViewInterruptedCreate: Ctrl-C while the create is
// under way (QEMU already runs) means the demo never gets a computer
// to delete; the daemon still ends it as it closes, and, read from the
// host, the computer's QEMU process and its cgroups are gone, and so is
// the demo's directory. The control that the path was taken: QEMU ran
// when Ctrl-C came, and the demo fails and names the computer it ended.
func TestIntegrationDemoViewInterruptedCreate(t *testing.T) {
	testenv.Require(t, "root", "qemu")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer, bins.VMGuest)
	if err != nil {
		t.Fatal(err)
	}
	var id, dir string
	var st vmFile
	creating := fmt.Sprintf("creating a VM computer with a screen (create --tier vm --screen; QEMU %s, %dx%d)...",
		vm.AccelTCG, vm.ScreenWidth, vm.ScreenHeight)
	out, err := interruptAt(ctx, exec.CommandContext(ctx, b.Path(bins.Computer), "demo-view", "--bin", b.Dir), creating,
		func(out []byte) (err error) {
			if dir, err = demoDir(out); err != nil {
				return err
			}
			id, st, err = runningQEMU(ctx, dir)
			return err
		})
	t.Logf("the demo said:\n%s", out)
	wantFailed(t, out, err, "ended "+id+" as the daemon closed")
	checkQEMUGone(t, st)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the demo's directory %s is left: %v", dir, err)
	}
}

// TestIntegrationDemoViewDeleteFails: when the final delete fails (a
// mount inside the computer's directory, so its teardown cannot remove
// the directory) the demo fails, the daemon's own ending destroys what
// it can (QEMU's process and cgroups are gone, read from the host), and
// what it could not remove is printed and kept, with the demo's
// directory, instead of being deleted out from under it. The control
// that the failure was real: the demo reports the failed delete.
func TestIntegrationDemoViewDeleteFails(t *testing.T) {
	testenv.Require(t, "root", "qemu")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer, bins.VMGuest)
	if err != nil {
		t.Fatal(err)
	}
	var id, dir, mnt string
	var st vmFile
	out, err := interruptWhenWaiting(ctx, exec.CommandContext(ctx, b.Path(bins.Computer), "demo-view", "--bin", b.Dir),
		func(out []byte) (err error) {
			if dir, err = demoDir(out); err != nil {
				return err
			}
			if id, st, err = runningQEMU(ctx, dir); err != nil {
				return err
			}
			mnt = filepath.Join(dir, "state", "computers", id, "pinned")
			if err := os.Mkdir(mnt, 0o700); err != nil {
				return err
			}
			return syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k")
		})
	if mnt != "" {
		t.Cleanup(func() {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
			os.RemoveAll(dir)
		})
	}
	t.Logf("the demo said:\n%s", out)
	wantFailed(t, out, err, "delete "+id+":", "could not remove everything", "kept "+dir, mnt)
	checkQEMUGone(t, st)
	if _, err := os.Stat(mnt); err != nil {
		t.Errorf("what the demo could not remove is gone anyway: %v", err)
	}
}

// running: pid is a live process (not gone, not a zombie).
func running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	return i >= 0 && i+2 < len(data) && data[i+2] != 'Z'
}
