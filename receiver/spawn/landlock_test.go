package spawn

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/ports"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// testRuleset allows the system read-only, a fresh grant root read-write
// and the TCP ports of ports; it returns the ruleset and the root.
func testRuleset(t testing.TB, ports ...PortRule) (*Ruleset, string) {
	t.Helper()
	return testRulesetBy(t, func(rules []Rule) (*Ruleset, error) { return NewRuleset(rules, ports...) })
}

// testRulesetBy is testRuleset with the ruleset made by build from the
// rules.
func testRulesetBy(t testing.TB, build func([]Rule) (*Ruleset, error)) (*Ruleset, string) {
	t.Helper()
	_, root := workDir(t)
	var rules []Rule
	add := func(p string, a Access) {
		f, err := os.OpenFile(p, unix.O_PATH, 0)
		if errors.Is(err, os.ErrNotExist) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		rules = append(rules, Rule{File: f, Access: a})
	}
	for _, p := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/proc"} {
		add(p, AccessReadExec)
	}
	add("/dev/null", AccessReadWriteFile)
	add(root, AccessAll)
	rs, err := build(rules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return rs, root
}

// TestLandlockConfinesChildOnly: a confined child can work in its root
// and read the system, but cannot read or write a file outside, which its
// uid could otherwise read; the receiver's threads stay unconfined.
func TestLandlockConfinesChildOnly(t *testing.T) {
	testenv.Require(t, "root")
	if LandlockABI() < MinLandlockABI {
		t.Fatalf("kernel Landlock ABI %d < %d: this machine cannot prove the control", LandlockABI(), MinLandlockABI)
	}
	outside := t.TempDir()
	os.Chmod(filepath.Dir(outside), 0o755)
	os.Chmod(outside, 0o777)
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("readable by everyone\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			rs, root := testRuleset(t)
			script := fmt.Sprintf(`cd %s && echo hi > mine && cat mine && cat /etc/hostname >/dev/null && echo sys-ok
cat %s && echo READ-OUTSIDE
echo x > %s/new && echo WROTE-OUTSIDE
exit 0`, root, secret, outside)
			dir, err := os.OpenFile(root, unix.O_PATH|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			c, out, err := start(mode, dir, rs, []string{"PATH=/usr/bin:/bin"}, "/bin/sh", "-c", script)
			if err != nil {
				t.Fatal(err)
			}
			<-c.Done()
			got := string(<-out)
			if !strings.Contains(got, "hi\nsys-ok\n") || strings.Contains(got, "OUTSIDE") {
				t.Fatalf("confined child output:\n%s", got)
			}
			if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("confined child wrote outside its root")
			}
		})
	}
	// Every receiver thread must still read the file: run the check on
	// many fresh threads.
	for range 32 {
		errc := make(chan error)
		go func() {
			_, err := os.ReadFile(secret)
			errc <- err
		}()
		if err := <-errc; err != nil {
			t.Fatalf("receiver thread confined after spawns: %v", err)
		}
	}
}

// TestLandlockScopesSignals: a confined child cannot signal a process
// outside its domain, even one of its own uid.
func TestLandlockScopesSignals(t *testing.T) {
	testenv.Require(t, "root")
	dir, _ := workDir(t)
	victim, _, err := start(ModeThread, dir, nil, nil, "/bin/sleep", "100")
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Kill()
	rs, _ := testRuleset(t)
	out, st := run(t, ModeThread, rs, "/bin/sh", "-c", fmt.Sprintf("kill -9 %d && echo KILLED", victim.PID()))
	if strings.Contains(out, "KILLED") || st.Code == 0 {
		t.Fatalf("confined child signalled an outside process: %q %+v", out, st)
	}
	select {
	case <-victim.Done():
		t.Fatal("victim died")
	default:
	}
}

// TestLandlockDeniesTCP: a confined child can neither connect to a TCP
// service on the host's 127.0.0.1 nor bind a TCP port, unless a port rule
// allows that port or the ruleset does not handle TCP (NewRulesetAnyTCP,
// the positive control); the receiver's own threads still connect.
func TestLandlockDeniesTCP(t *testing.T) {
	testenv.Require(t, "root")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("secret\n"))
			c.Close()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	// A port below the ephemeral range: one that was free a moment ago
	// inside it can meanwhile be any connection's source port, and the
	// allowed bind then fails with "address in use" (1 run in 20 under
	// the flake hunt).
	free := ports.Quiet(t)
	// busybox nc listens until timeout ends it when the bind worked, and
	// says "nc: bind: Permission denied" at once when Landlock refused it.
	script := fmt.Sprintf(`exec 3<>/dev/tcp/127.0.0.1/%d && head -n1 <&3 && echo CONNECTED
timeout 1 busybox nc -l -p %d </dev/null 2>&1 | grep 'bind' || echo BOUND
exit 0`, port, free)
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			rs, _ := testRuleset(t)
			if out, _ := run(t, mode, rs, "/bin/bash", "-c", script); strings.Contains(out, "secret") ||
				strings.Contains(out, "CONNECTED") || strings.Contains(out, "BOUND") ||
				!strings.Contains(out, "nc: bind: Permission denied") {
				t.Fatalf("confined child used TCP, or its bind failed for another reason than Landlock:\n%s", out)
			}
			allowed, _ := testRuleset(t, PortRule{Port: port, Access: NetConnectTCP}, PortRule{Port: free, Access: NetBindTCP})
			if out, _ := run(t, mode, allowed, "/bin/bash", "-c", script); !strings.Contains(out, "secret\nCONNECTED\n") ||
				!strings.Contains(out, "BOUND") {
				t.Fatalf("child with port rules could not use them:\n%s", out)
			}
			anyTCP, _ := testRulesetBy(t, NewRulesetAnyTCP)
			if out, _ := run(t, mode, anyTCP, "/bin/bash", "-c", script); !strings.Contains(out, "secret\nCONNECTED\n") ||
				!strings.Contains(out, "BOUND") {
				t.Fatalf("child of a ruleset that does not handle TCP could not use it:\n%s", out)
			}
		})
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("receiver thread confined after spawns: %v", err)
	}
	c.Close()
}

// noKillEnv makes the test binary check, under capsh without CAP_KILL,
// that Start refuses naming KILL and that no child ever appears.
const noKillEnv = "TETHER_SPAWN_TEST_NOKILL"

func noKillMain() {
	dir, err := os.OpenFile(os.Getenv(noKillEnv), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	_, w, _ := os.Pipe()
	for _, mode := range []Mode{ModeThread, ModeHelper} {
		c, err := Start(Spec{Mode: mode, Path: "/bin/sleep", Argv: []string{"sleep", "100"}, Env: []string{},
			Dir: dir, Output: w, UID: uid, GID: gid})
		var ce *CapError
		if c != nil || !errors.As(err, &ce) || len(ce.Missing) != 1 || ce.Missing[0] != "KILL" {
			fmt.Printf("Start without KILL = %v, %v; want CapError [KILL]\n", c, err)
			os.Exit(1)
		}
	}
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", os.Getpid(), os.Getpid()))
	if err != nil || len(strings.TrimSpace(string(kids))) > 0 {
		fmt.Printf("children exist: %q (%v)\n", kids, err)
		os.Exit(1)
	}
	fmt.Println("refused: KILL")
	os.Exit(0)
}

// TestMissingKillStartsNothing runs the test binary without CAP_KILL in
// its bounding (and so effective) set: Start must refuse naming KILL, and
// no process of the child uid may appear.
func TestMissingKillStartsNothing(t *testing.T) {
	testenv.Require(t, "root", "capsh")
	capsh, err := exec.LookPath("capsh")
	if err != nil {
		t.Fatalf("capsh not found (ci/setup installs libcap2-bin): %v", err)
	}
	_, path := workDir(t)
	waitNoUID(t, uid) // children of earlier tests are reaped asynchronously
	var out []byte
	withReaperHeld(func() {
		cmd := exec.Command(capsh, "--drop=cap_kill", "--", "-c", `exec "$0"`, os.Args[0])
		cmd.Env = append(os.Environ(), noKillEnv+"="+path, "GORACE=atexit_sleep_ms=0")
		out, err = cmd.CombinedOutput()
	})
	if err != nil || strings.TrimSpace(string(out)) != "refused: KILL" {
		t.Fatalf("helper without CAP_KILL: %v\n%s", err, out)
	}
	if ps := procsOfUID(t, uid); len(ps) > 0 {
		t.Fatalf("processes %v of uid %d appeared", ps, uid)
	}
}
