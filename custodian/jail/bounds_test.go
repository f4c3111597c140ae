package jail

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// DefaultID is the uid the attack tests pin (jail.uid): every jail's
// uid before each drew its own. hostSleeper runs a host process as it,
// the worst case of a neighbour with the agent's uid.
const DefaultID = 59999

// More roles of the test binary (TestMain dispatches through boundsMain).
const (
	envHold      = "TETHER_JAIL_TEST_HOLD"      // an agent that holds until stdin closes
	envCustodian = "TETHER_JAIL_TEST_CUSTODIAN" // JSON custodianPlan: start a jail, print its scratch directory, wait
)

// custodianPlan is what a helper custodian (a child the test SIGKILLs)
// starts.
type custodianPlan struct {
	Exe, Root, ScratchParent string
}

// boundsMain runs the test binary's roles added for the jail's bounds.
func boundsMain() (int, bool) {
	if os.Getenv(envHold) == "1" {
		fmt.Println("holding")
		io.Copy(io.Discard, os.Stdin)
		return 0, true
	}
	if plan := os.Getenv(envCustodian); plan != "" {
		return custodianMain(plan), true
	}
	return 0, false
}

// custodianMain starts a jail that holds, prints its scratch directory
// and waits to be killed.
func custodianMain(planJSON string) int {
	var p custodianPlan
	if err := json.Unmarshal([]byte(planJSON), &p); err != nil {
		fmt.Fprintln(os.Stderr, "custodian: plan:", err)
		return 2
	}
	spec, err := Build(Options{Argv: []string{p.Exe, "jail-hold"}, Root: p.Root, Env: holdEnv(), Helper: p.Exe, ScratchParent: p.ScratchParent})
	if err != nil {
		fmt.Fprintln(os.Stderr, "custodian: build:", err)
		return 2
	}
	proc, err := Start(spec, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "custodian: start:", err)
		return 2
	}
	line, err := bufio.NewReader(proc.Stdout).ReadString('\n')
	if err != nil || line != "holding\n" {
		fmt.Fprintf(os.Stderr, "custodian: the agent said %q, %v\n", line, err)
		return 2
	}
	fmt.Println(proc.scratch)
	select {}
}

// holdEnv is the environment of an agent that holds.
func holdEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envCustodian+"=") && !strings.HasPrefix(kv, envAttack+"=") {
			env = append(env, kv)
		}
	}
	return append(env, envHold+"=1")
}

// startHolder starts a jail whose agent holds until its stdin closes,
// and waits until it runs.
func startHolder(t *testing.T, s *scene, o Options) (*Process, *syncBuffer) {
	t.Helper()
	o.Argv, o.Root, o.Env, o.Helper = []string{s.exe, "jail-hold"}, s.root, holdEnv(), s.exe
	spec, err := Build(o)
	mustDo(t, err)
	stderr := &syncBuffer{}
	proc, err := Start(spec, stderr)
	if err != nil {
		t.Fatalf("start: %v\nstderr:\n%s", err, stderr)
	}
	t.Cleanup(func() { proc.Kill(); proc.Stdin.Close(); proc.Stdout.Close(); proc.Wait() })
	line, err := bufio.NewReader(proc.Stdout).ReadString('\n')
	if err != nil || line != "holding\n" {
		t.Fatalf("the holding agent said %q, %v\nstderr:\n%s", line, err, stderr)
	}
	return proc, stderr
}

// agentUID reads the real, effective, saved and file system uid of the
// jail's agent from the host (the holder is bwrap's grandchild).
func agentUID(t *testing.T, proc *Process) string {
	t.Helper()
	leader, err := sessionLeader(proc.Pid())
	mustDo(t, err)
	ents, err := os.ReadDir("/proc")
	mustDo(t, err)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, err := parentAndGroup(pid); err == nil && ppid == leader {
			return statusOf(t, pid)["Uid"]
		}
	}
	t.Fatalf("no agent below the jail's pid 1 (%d)", leader)
	return ""
}

// TestIntegrationJailOwnUID: two jails running at once each have a uid of
// their own, drawn from the range, that the agent runs as and the scratch
// directory is named for. Positive control: a pinned jail.uid is what the
// agent runs as (the uid is the configuration's, not a constant), and a
// second jail pinned to it is refused while the first runs (ErrUID), so
// no two live jails ever share a uid.
func TestIntegrationJailOwnUID(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	s := newScene(t)
	a, _ := startHolder(t, s, Options{})
	b, _ := startHolder(t, s, Options{})
	ua, ub := agentUID(t, a), agentUID(t, b)
	for _, c := range []struct {
		proc *Process
		uid  string
	}{{a, ua}, {b, ub}} {
		id := c.proc.spec.UID
		if id < DefaultUIDFirst || id > DefaultUIDLast || c.proc.spec.GID != id {
			t.Errorf("jail's ids %d/%d, want one id of %d-%d for both", id, c.proc.spec.GID, DefaultUIDFirst, DefaultUIDLast)
		}
		if want := strings.Repeat(strconv.Itoa(int(id))+"\t", 4); c.uid != want[:len(want)-1] {
			t.Errorf("agent's Uid %q seen from the host, want %d four times", c.uid, id)
		}
		if got, ok := parseScratchName(filepath.Base(c.proc.scratch)); !ok || got != id {
			t.Errorf("scratch directory %s is not named for uid %d", c.proc.scratch, id)
		}
	}
	if ua == ub {
		t.Errorf("two live jails share uid %q", ua)
	}
	pin := uint32(DefaultUIDFirst - 1)
	p, _ := startHolder(t, s, Options{Config: Config{UID: &pin}})
	if got := agentUID(t, p); got != "58999\t58999\t58999\t58999" {
		t.Errorf("pinned jail: agent's Uid %q, want 58999", got)
	}
	spec, err := Build(Options{Config: Config{UID: &pin}, Argv: []string{s.exe}, Root: s.root, Env: holdEnv(), Helper: s.exe})
	mustDo(t, err)
	if second, err := Start(spec, io.Discard); !errors.Is(err, ErrUID) {
		if second != nil {
			second.Kill()
			second.Wait()
		}
		t.Errorf("a second jail pinned to the live jail's uid 58999: %v, want ErrUID", err)
	}
}

// TestIntegrationJailSweep: a custodian SIGKILLed while its jail runs
// leaves the jail's (empty, root's) scratch directory behind; the next
// start removes it. Positive control: with the sweep off, a start leaves
// it in place.
func TestIntegrationJailSweep(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	s := newScene(t)
	parent := filepath.Join(s.base, "scratch")
	mustDo(t, os.Mkdir(parent, 0o755))
	planJSON, err := json.Marshal(custodianPlan{Exe: s.exe, Root: s.root, ScratchParent: parent})
	mustDo(t, err)
	cmd := exec.Command(s.exe)
	cmd.Env = append(os.Environ(), envCustodian+"="+string(planJSON))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	mustDo(t, err)
	mustDo(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the helper custodian printed no scratch directory: %v", err)
	}
	stale := strings.TrimSpace(line)
	mustDo(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	if _, err := os.Lstat(stale); err != nil {
		t.Fatalf("the killed custodian's scratch directory %s: %v; want it left behind (the case the sweep is for)", stale, err)
	}
	skipSweep = true
	p, _ := startHolder(t, s, Options{ScratchParent: parent})
	skipSweep = false
	if _, err := os.Lstat(stale); err != nil {
		t.Errorf("positive control: with the sweep off, %s: %v; want it still there", stale, err)
	}
	p.Stdin.Close()
	mustDo(t, p.Wait())
	startHolder(t, s, Options{ScratchParent: parent})
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the next start, %s: %v; want it swept", stale, err)
	}
}

func TestParseScratchName(t *testing.T) {
	for name, want := range map[string]uint32{"tether-jail-59123-4021": 59123, "tether-jail-1-0": 1} {
		if got, ok := parseScratchName(name); !ok || got != want {
			t.Errorf("%s: %d, %v; want %d", name, got, ok, want)
		}
	}
	for _, name := range []string{"tether-jail-4021", "tether-jail-0-1", "tether-jail-059123-1", "tether-jail-59123-",
		"tether-jail-59123-1x", "tether-jail--1", "tether-jail-4294967296-1", "other-59123-1", "tether-jail-59123-1/.."} {
		if got, ok := parseScratchName(name); ok {
			t.Errorf("%s: parsed as uid %d, want refused", name, got)
		}
	}
}

// FuzzParseScratchName: a name that parses is exactly the name the jail
// makes for that uid.
func FuzzParseScratchName(f *testing.F) {
	f.Add("tether-jail-59123-4021")
	f.Add("tether-jail-059123-1")
	f.Fuzz(func(t *testing.T, name string) {
		uid, ok := parseScratchName(name)
		if !ok {
			return
		}
		prefix := strings.TrimSuffix(scratchPattern(uid), "*")
		if uid == 0 || !strings.HasPrefix(name, prefix) || !allDigits(name[len(prefix):]) {
			t.Fatalf("%q parsed as uid %d", name, uid)
		}
	})
}

func TestStatusIDs(t *testing.T) {
	out := map[uint32]bool{}
	statusIDs("Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t7\t7\t7\t7\nGroups:\t5 6\n", out)
	for _, id := range []uint32{1000, 1001, 1002, 1003, 7} {
		if !out[id] {
			t.Errorf("id %d missing from %v", id, out)
		}
	}
	if out[5] || out[6] || len(out) != 5 {
		t.Errorf("ids %v, want the Uid and Gid lines' only", out)
	}
}
