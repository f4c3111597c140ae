package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// The isolation attacks of fixtures/computer/attack_test.go, run by a
// command in a VM computer the service made, through the custodian's
// configuration, as an agent's run_command would. Each has a positive
// control that shows the probe succeeds where the control is off (on the
// host itself, in the attacker's own guest, or under a larger limit).
// Two computers serve every attack, to keep boots few: a is the
// attacker, b its neighbour. Both boot the guest image (serve's default
// mode), whose bash, perl, python3 and curl the attacks run.

// Limits of the attacking computer.
const (
	attackPids = 64
	attackDisk = 64 << 20
)

// TestIntegrationVMSvcAttacks runs the attacks against two VM computers
// made through the service.
func TestIntegrationVMSvcAttacks(t *testing.T) {
	h := newSvcHarness(t, svcGuestImage)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	a := h.create(t, ctx, api.Limits{Pids: attackPids, DiskBytes: attackDisk})
	b := h.create(t, ctx, api.Limits{})
	t.Run("HostLoopback", func(t *testing.T) { attackHostLoopback(t, ctx, a) })
	t.Run("HostPaths", func(t *testing.T) { attackHostPaths(t, ctx, h, a, b) })
	t.Run("NeighbourProcesses", func(t *testing.T) { attackNeighbour(t, ctx, a, b) })
	t.Run("Pids", func(t *testing.T) { attackPidsBounded(t, ctx, a) })
	t.Run("Disk", func(t *testing.T) { attackDiskBounded(t, ctx, a) })
	// Last: the guest's kernel may end more than the hog.
	t.Run("Memory", func(t *testing.T) { attackMemoryBounded(t, ctx, a) })
}

func attackHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// attackRun is a finished command.
type attackRun struct {
	out  string
	exit wire.ExitStatus
}

func (r attackRun) String() string {
	code := "none"
	if r.exit.ExitCode != nil {
		code = strconv.Itoa(*r.exit.ExitCode)
	}
	return fmt.Sprintf("exit code %s signal %q, output:\n%s", code, r.exit.Signal, r.out)
}

// runFull runs a bash script in c as the grant's uid through the
// custodian's configuration and returns its output and exit.
func (c *svcComputer) runFull(t *testing.T, ctx context.Context, script string) attackRun {
	t.Helper()
	id, wc := c.start(t, ctx, script)
	defer wc.Close()
	var w wire.ExecWaitResult
	c.call(t, ctx, wc, wire.OpExecWait, wire.TerminalArgs{TerminalID: id}, &w)
	return attackRun{out: c.output(t, ctx, wc, id), exit: w.Exit}
}

// start starts a bash script in c and returns its terminal and the
// client that started it (the caller closes it; the command lives while
// it is open).
func (c *svcComputer) start(t *testing.T, ctx context.Context, script string) (string, *wireclient.Client) {
	t.Helper()
	wc, err := provision.WireClient(ctx, custodianDialer{c.cfg})
	if err != nil {
		t.Fatal(err)
	}
	var st wire.ExecStartResult
	c.call(t, ctx, wc, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/bash", "-c", script},
		Env: map[string]string{"PATH": "/usr/bin:/bin"}}, &st)
	return st.TerminalID, wc
}

func (c *svcComputer) call(t *testing.T, ctx context.Context, wc *wireclient.Client, op wire.Op, args, res any) {
	t.Helper()
	key := fmt.Sprintf("attack-%s", attackHex(8))
	if err := wc.Call(ctx, op, c.Tuple().SHA256(), key, time.Now().Add(5*time.Minute), args, res); err != nil {
		t.Fatalf("%s: %v", op, err)
	}
}

func (c *svcComputer) output(t *testing.T, ctx context.Context, wc *wireclient.Client, id string) string {
	t.Helper()
	var o wire.ExecOutputResult
	c.call(t, ctx, wc, wire.OpExecOutput, wire.TerminalArgs{TerminalID: id}, &o)
	return o.Output
}

// awaitOutput polls a running command's output until it holds want.
func (c *svcComputer) awaitOutput(t *testing.T, ctx context.Context, wc *wireclient.Client, id, want string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out := c.output(t, ctx, wc, id)
		if strings.Contains(out, want) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command never printed %q; output:\n%s", want, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serveSecret answers every connection to a fresh listener on the
// host's 127.0.0.1 with an HTTP response holding a fresh secret, until
// the test ends.
func serveSecret(t *testing.T) (port int, secret string) {
	t.Helper()
	secret = "host-loopback-" + attackHex(8)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(conn, "HTTP/1.0 200 OK\r\n\r\n%s\n", secret)
			conn.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, secret
}

// attackHostLoopback: a command cannot reach a service on the host's
// 127.0.0.1, neither as 127.0.0.1 nor through a user-mode network's host
// alias (10.0.2.2), with bash's /dev/tcp or curl; QEMU itself runs in a
// network namespace of its own. The positive control runs the same
// probe on the host, where it reads the secret.
func attackHostLoopback(t *testing.T, ctx context.Context, a *svcComputer) {
	port, secret := serveSecret(t)
	probe := fmt.Sprintf(`for h in 127.0.0.1 10.0.2.2; do (exec 3<>/dev/tcp/$h/%d && timeout 5 cat <&3) 2>&1 | head -3; curl -s --max-time 5 http://$h:%d/; done; exit 0`, port, port)
	out, err := exec.CommandContext(ctx, "/bin/bash", "-c", probe).CombinedOutput()
	if !strings.Contains(string(out), secret) {
		t.Fatalf("control: the probe on the host did not read the host's loopback service: %v\n%s", err, out)
	}
	r := a.runFull(t, ctx, probe)
	if strings.Contains(r.out, secret) {
		t.Fatalf("the command read the host's loopback service: %v", r)
	}
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	qemu, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", a.m.qemuPID()))
	if err != nil || qemu == host {
		t.Fatalf("QEMU's network namespace %q (%v), the host's %q", qemu, err, host)
	}
	t.Logf("in the guest: %s", strings.ReplaceAll(strings.TrimSpace(r.out), "\n", " | "))
}

// attackHostPaths: the host's files are absent from the guest: a marker
// in the host's temporary directory, one in the service's directory, the
// custodian configuration and audit key of the computer and of its
// neighbour, both computers' directories, and the host's /etc/shadow. Positive controls: every path exists on the host with the
// content looked for, and the same probe reads a file the command wrote
// into its own root.
func attackHostPaths(t *testing.T, ctx context.Context, h *svcHarness, a, b *svcComputer) {
	marker := "host-path-" + attackHex(8)
	tmp := filepath.Join(os.TempDir(), "tether-vm-marker-"+attackHex(4))
	svc := filepath.Join(h.base, "svc", "marker-"+attackHex(4))
	for _, p := range []string{tmp, svc} {
		if err := os.WriteFile(p, []byte(marker+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	shadow, err := os.ReadFile("/etc/shadow")
	if err != nil || len(shadow) == 0 {
		t.Fatalf("control: the host's /etc/shadow: %v", err)
	}
	paths := []string{tmp, svc, "/etc/shadow"}
	for _, c := range []*svcComputer{a, b} {
		paths = append(paths, c.c.CustodianConfig, c.cfg.AuditKeyFile, c.m.Dir())
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("control: %s is absent on the host too: %v", p, err)
		}
	}
	own := GuestRoot + "/own-" + attackHex(4)
	line := "echo " + marker + " > " + own + "; for p in " + strings.Join(append(paths, own), " ") +
		`; do if [ -e "$p" ]; then echo "PRESENT $p"; cat "$p" 2>&1 | head -c 4096; fi; done; exit 0`
	r := a.runFull(t, ctx, line)
	if !strings.Contains(r.out, "PRESENT "+own+"\n"+marker) {
		t.Fatalf("control: the probe did not read the command's own file: %v", r)
	}
	firstLine, _, _ := strings.Cut(string(shadow), "\n")
	for _, p := range paths {
		if p == "/etc/shadow" {
			if strings.Contains(r.out, firstLine) {
				t.Fatalf("the command read the host's /etc/shadow: %v", r)
			}
			continue
		}
		if strings.Contains(r.out, "PRESENT "+p+"\n") {
			t.Fatalf("the host's %s is present in the guest: %v", p, r)
		}
	}
	if strings.Count(r.out, marker) != 1 {
		t.Fatalf("the host's marker is readable in the guest: %v", r)
	}
}

// attackNeighbour: a command sees neither the neighbour computer's
// command lines nor the host's (a host process and the neighbour's QEMU),
// and cannot kill the neighbour's command, by its pid or with kill -1.
// Positive controls: the host sees its secret, the neighbour's guest
// lists its command, and the same probe sees and kills a process of the
// command's own.
func attackNeighbour(t *testing.T, ctx context.Context, a, b *svcComputer) {
	hostSecret, neighbourSecret := "host-token-"+attackHex(8), "neighbour-token-"+attackHex(8)
	host := hostSleeperNamed(t, hostSecret)
	id, wc := b.start(t, ctx, "echo started; exec -a "+neighbourSecret+" sleep 300")
	defer wc.Close()
	b.awaitOutput(t, ctx, wc, id, "started")
	pid := commandPID(t, ctx, b, neighbourSecret)
	if !hostCmdline(t, host, hostSecret) {
		t.Fatal("control: the host does not see its own secret in /proc")
	}
	own := "own-token-" + attackHex(8)
	r := a.runFull(t, ctx, fmt.Sprintf(`(exec -a %s sleep 300) & own=$!
for i in $(seq 200); do grep -qs %s /proc/$own/cmdline && break; sleep 0.05; done
cat /proc/[0-9]*/cmdline | tr '\0' ' '; echo
kill -9 %d 2>&1; kill -9 -1 2>&1; kill -9 $own 2>&1; wait $own; echo "OWN-EXIT $?"`, own, own, pid))
	for _, s := range []string{hostSecret, neighbourSecret, "qemu", b.c.ID} {
		if strings.Contains(r.out, s) {
			t.Fatalf("the command read %q in a command line: %v", s, r)
		}
	}
	if !strings.Contains(r.out, own) || !strings.Contains(r.out, "OWN-EXIT 137\n") {
		t.Fatalf("control: the probe did not see and kill the command's own process: %v", r)
	}
	if got := commandPID(t, ctx, b, neighbourSecret); got != pid {
		t.Fatalf("the neighbour's command is now pid %d, was %d", got, pid)
	}
}

// hostSleeper starts sleep on the host with secret as its argv[0];
// cleanup kills and reaps it.
func hostSleeperNamed(t *testing.T, secret string) int {
	t.Helper()
	path, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{Path: path, Args: []string{secret, "300"}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd.Process.Pid
}

func hostCmdline(t *testing.T, pid int, secret string) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), secret)
}

// commandPID is the guest pid of c's process whose argv[0] is argv0,
// once there is one (the command's exec may not have happened yet).
func commandPID(t *testing.T, ctx context.Context, c *svcComputer, argv0 string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, err := c.Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if len(p.Cmdline) > 0 && p.Cmdline[0] == argv0 {
				return p.PID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process %q in %s: %+v", argv0, c.c.ID, ps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitNoCommand waits until c has no process whose argv[0] is argv0.
func waitNoCommand(t *testing.T, ctx context.Context, c *svcComputer, argv0 string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, err := c.Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, p := range ps {
			if len(p.Cmdline) > 0 && p.Cmdline[0] == argv0 {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q still runs in %s: %+v", argv0, c.c.ID, ps)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// forkScript forks n children that sleep and prints how many it got.
func forkScript(n int) string {
	return fmt.Sprintf(`perl -e '$| = 1; my $n = 0; for (1..%d) { my $p = fork; if (!defined $p) { next } if ($p == 0) { sleep 60; exit } $n++ } print "forked $n\n"'`, n)
}

func forkCount(t *testing.T, r attackRun) int {
	t.Helper()
	i := strings.Index(r.out, "forked ")
	var n int
	if i < 0 {
		t.Fatalf("no fork count: %v", r)
	}
	if _, err := fmt.Sscanf(r.out[i:], "forked %d", &n); err != nil {
		t.Fatalf("no fork count: %v", r)
	}
	return n
}

// attackPidsBounded: a command forking 1,500 children gets fewer than
// the computer's pids limit; the positive control is 16 forks, all of
// which succeed. No forked child outlives its command.
func attackPidsBounded(t *testing.T, ctx context.Context, a *svcComputer) {
	if n := forkCount(t, a.runFull(t, ctx, forkScript(16))); n != 16 {
		t.Fatalf("control: forked %d of 16 under a limit of %d", n, attackPids)
	}
	waitNoCommand(t, ctx, a, "perl")
	r := a.runFull(t, ctx, forkScript(1500))
	n := forkCount(t, r)
	if n >= attackPids || n < attackPids/2 {
		t.Fatalf("forked %d of 1500 with pids %d: %v", n, attackPids, r)
	}
	t.Logf("forked %d of 1500 under pids %d", n, attackPids)
	waitNoCommand(t, ctx, a, "perl")
}

// attackDiskBounded: the root holds the computer's disk_bytes and no
// more: 8 MiB fit (the positive control), 128 MiB more fail with ENOSPC,
// and the host file behind the guest's disk takes no more of the host's
// file system than its own size.
func attackDiskBounded(t *testing.T, ctx context.Context, a *svcComputer) {
	disk := a.m.diskPath()
	size := hostFileSize(t, disk)
	if size > attackDisk+attackDisk/4 {
		t.Fatalf("the computer's disk is %d bytes, for disk_bytes %d", size, attackDisk)
	}
	r := a.runFull(t, ctx, "cd "+GuestRoot+" && dd if=/dev/zero of=a bs=1M count=8 2>/dev/null && echo WROTE-8; "+
		"dd if=/dev/zero of=b bs=1M count=128 2>&1 | grep -o 'No space left on device' | head -1; "+
		"ls -l b | awk '{print \"B-BYTES\", $5}'; sync; rm -f a b")
	if !strings.Contains(r.out, "WROTE-8\nNo space left on device\n") {
		t.Fatalf("writes into the root: %v; want 8 MiB written, then ENOSPC", r)
	}
	var wrote int64
	if i := strings.Index(r.out, "B-BYTES "); i < 0 {
		t.Fatalf("no size of the large file: %v", r)
	} else if _, err := fmt.Sscanf(r.out[i:], "B-BYTES %d", &wrote); err != nil || wrote >= attackDisk {
		t.Fatalf("the large file holds %d bytes (%v) under disk_bytes %d", wrote, err, attackDisk)
	}
	used := hostAllocated(t, disk)
	if used > size+1<<20 {
		t.Fatalf("the disk file takes %d bytes of the host's file system, more than its size %d", used, size)
	}
	t.Logf("ENOSPC after %d bytes of 128 MiB; the disk file takes %d of its %d bytes on the host", wrote, used, size)
}

func hostFileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func hostAllocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// hog allocates and touches 8 MiB at a time up to limit MiB, printing
// each step.
const hog = `python3 -c 'import sys
a = []
for i in range(int(sys.argv[1]) // 8):
    a.append(bytearray(8 << 20))
    print("MIB", 8 * len(a), flush=True)
print("TOUCHED", flush=True)' %d`

// attackMemoryBounded: a command touching 3 GiB in a 192 MiB computer
// is ended inside the guest (killed, or refused with MemoryError), QEMU
// lives on within its host cgroup (whose peak stays under its limit, and
// no host OOM kill happens in it), and the computer runs the next
// command. The positive control touches 32 MiB, which succeeds.
func attackMemoryBounded(t *testing.T, ctx context.Context, a *svcComputer) {
	if r := a.runFull(t, ctx, fmt.Sprintf(hog, 32)); !strings.Contains(r.out, "TOUCHED") {
		t.Fatalf("control: 32 MiB not touched in a %d MiB computer: %v", svcMemory>>20, r)
	}
	pid := a.m.qemuPID()
	cg := a.m.cg.dir("memory")
	r := a.runFull(t, ctx, fmt.Sprintf(hog, 3<<10))
	if strings.Contains(r.out, "TOUCHED") {
		t.Fatalf("3 GiB touched in a %d MiB computer: %v", svcMemory>>20, r)
	}
	if r.exit.Signal != "KILL" && !strings.Contains(r.out, "MemoryError") {
		t.Fatalf("the hog ended neither killed nor refused: %v", r)
	}
	mib := 0
	for _, l := range strings.Split(r.out, "\n") {
		fmt.Sscanf(l, "MIB %d", &mib)
	}
	t.Logf("the hog reached %d MiB and ended: signal %q", mib, r.exit.Signal)
	if mib > svcMemory>>20 {
		t.Fatalf("the hog touched %d MiB in a %d MiB computer", mib, svcMemory>>20)
	}
	limit, peak := hostCgroupValue(t, cg, "memory.limit_in_bytes"), hostCgroupValue(t, cg, "memory.max_usage_in_bytes")
	if peak > limit || limit != svcMemory+OverheadBytes {
		t.Fatalf("QEMU's cgroup peaked at %d bytes, limit %d (want %d)", peak, limit, svcMemory+OverheadBytes)
	}
	if oom := hostOOMKills(t, cg); oom != 0 {
		t.Fatalf("the host's OOM killer ended %d processes in QEMU's cgroup", oom)
	}
	if got := a.m.qemuPID(); got != pid || !a.m.alive() {
		t.Fatalf("QEMU %d did not live on (now %d)", pid, got)
	}
	if r := a.runFull(t, ctx, "echo alive"); r.out != "alive\n" {
		t.Fatalf("after the hog: %v", r)
	}
	t.Logf("QEMU's cgroup: peak %d MiB of a %d MiB limit, failcnt %d (reclaim at the limit, page cache included)",
		peak>>20, limit>>20, hostCgroupValue(t, cg, "memory.failcnt"))
}

func hostCgroupValue(t testing.TB, dir, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// cgroupOOMKills is the oom_kill count of memory.oom_control (zero
// where the kernel does not count).
func hostOOMKills(t *testing.T, dir string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
