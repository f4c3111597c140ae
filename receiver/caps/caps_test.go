package caps

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/syndtr/gocapability/capability"
	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// helperEnv makes the test binary act as a process that runs Check and
// prints the names of the missing capabilities as JSON.
const helperEnv = "TETHER_CAPS_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "narrow" {
		err := Narrow()
		sts, _ := ThreadStatuses(0)
		masks := map[string]bool{}
		for _, st := range sts {
			masks[fmt.Sprintf("%016x %016x %016x %016x %016x %d", st.CapEff, st.CapPrm, st.CapBnd, st.CapInh, st.CapAmb, st.NoNewPrivs)] = true
		}
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"error": fmt.Sprint(err), "masks": masks, "threads": len(sts)})
		os.Exit(0)
	}
	if os.Getenv(helperEnv) == "check" {
		err := Check()
		var me *MissingError
		names := []string{}
		if errors.As(err, &me) {
			names = me.Names()
		}
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"missing": names, "error": fmt.Sprint(err)})
		if err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestRequiredMask(t *testing.T) {
	var m uint64
	for _, c := range Required {
		m |= 1 << uint(c)
	}
	if m != RequiredMask || RequiredMask != 0x1eb {
		t.Fatalf("RequiredMask = %#x, Required gives %#x, want 0x1eb", RequiredMask, m)
	}
	got := []string{}
	for _, c := range Required {
		got = append(got, Name(c))
	}
	want := []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID", "SETPCAP"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("names = %v, want %v", got, want)
	}
}

func TestCheckPassesAsRoot(t *testing.T) {
	testenv.Require(t, "root")
	if err := Check(); err != nil {
		t.Fatalf("Check as root with all capabilities: %v", err)
	}
}

// TestCheckReadsTheThread drops KILL from the effective set of one locked
// thread only: Check of that thread must name KILL (effective only) while
// the process's other threads still pass.
func TestCheckReadsTheThread(t *testing.T) {
	testenv.Require(t, "root")
	type res struct {
		tid int
		err error
	}
	ready, done := make(chan res), make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is tainted and dies with the goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		err := unix.Capget(&hdr, &data[0])
		if err == nil {
			data[0].Effective &^= 1 << uint(capability.CAP_KILL)
			err = unix.Capset(&hdr, &data[0])
		}
		ready <- res{unix.Gettid(), err}
		<-done
	}()
	r := <-ready
	defer close(done)
	if r.err != nil {
		t.Fatalf("capset on the test thread: %v", r.err)
	}
	err := CheckTID(r.tid)
	var me *MissingError
	if !errors.As(err, &me) || !errors.Is(err, ErrMissing) {
		t.Fatalf("CheckTID(thread without effective KILL) = %v, want *MissingError", err)
	}
	want := []Missing{{Cap: "KILL", Sets: []string{SetEffective}}}
	if !reflect.DeepEqual(me.Missing, want) || me.TID != r.tid {
		t.Fatalf("missing = %+v on %d, want %+v on %d", me.Missing, me.TID, want, r.tid)
	}
	if !strings.Contains(err.Error(), "KILL") {
		t.Fatalf("error %q does not name KILL", err)
	}
	if err := Check(); err != nil {
		t.Fatalf("Check on another thread: %v", err)
	}
}

// TestCheckNamesEachMissing starts the test binary under capsh with each
// required capability dropped from its bounding set in turn: Check must
// fail and name exactly that capability, missing from all three sets.
func TestCheckNamesEachMissing(t *testing.T) {
	testenv.Require(t, "root", "capsh")
	capsh, err := exec.LookPath("capsh")
	if err != nil {
		t.Fatalf("capsh not found (ci/setup installs libcap2-bin): %v", err)
	}
	for _, c := range Required {
		t.Run(Name(c), func(t *testing.T) {
			cmd := exec.Command(capsh, "--drop=cap_"+c.String(), "--", "-c", `exec "$0"`, os.Args[0])
			cmd.Env = append(os.Environ(), helperEnv+"=check", "GORACE=atexit_sleep_ms=0")
			out, err := cmd.Output()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("helper without %s: err %v, output %s; want exit status 1", Name(c), err, out)
			}
			var got struct {
				Missing []string `json:"missing"`
				Error   string   `json:"error"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("helper output %q: %v", out, err)
			}
			if !reflect.DeepEqual(got.Missing, []string{Name(c)}) {
				t.Fatalf("missing = %v, want [%s]", got.Missing, Name(c))
			}
			want := Name(c) + " (not in effective, permitted, bounding)"
			if !strings.Contains(got.Error, want) {
				t.Fatalf("error %q does not contain %q", got.Error, want)
			}
		})
	}
}

func TestCheckRefusesNonRoot(t *testing.T) {
	testenv.Require(t, "root")
	cmd := exec.Command(worldExecutableCopy(t))
	cmd.Env = append(os.Environ(), helperEnv+"=check", "GORACE=atexit_sleep_ms=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 60010, Gid: 60010, Groups: []uint32{}}}
	out, err := cmd.Output()
	if err == nil || !strings.Contains(string(out), "receiver must run as uid 0") {
		t.Fatalf("Check as uid 60010: err %v, output %s; want refusal naming uid 0", err, out)
	}
}

func TestNarrow(t *testing.T) {
	testenv.Require(t, "root")
	if !cgoEnabled() {
		testNarrowInHelper(t)
		t.Log("narrowed every thread of a helper process to exactly the seven")
		return
	}
	// With cgo (go test -race), AllThreadsSyscall cannot reach every thread;
	// Narrow must refuse before changing anything.
	before, err := ReadStatus("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if err := Narrow(); !errors.Is(err, ErrAllThreads) {
		t.Fatalf("Narrow under cgo = %v, want ErrAllThreads", err)
	}
	after, err := ReadStatus("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if before.CapBnd != after.CapBnd || before.CapEff != after.CapEff {
		t.Fatalf("Narrow changed the process although it failed: %x/%x -> %x/%x",
			before.CapBnd, before.CapEff, after.CapBnd, after.CapEff)
	}
}

// cgoEnabled reports whether AllThreadsSyscall is unavailable here.
func cgoEnabled() bool {
	_, _, e := syscall.AllThreadsSyscall(syscall.SYS_GETPID, 0, 0, 0)
	return e == syscall.ENOTSUP
}

func TestVerifyThreadNamesTheField(t *testing.T) {
	good := Status{CapEff: RequiredMask, CapPrm: RequiredMask, CapBnd: RequiredMask}
	if err := verifyThread(1, good); err != nil {
		t.Fatalf("exact status refused: %v", err)
	}
	cases := map[string]func(*Status){
		"CapEff":     func(s *Status) { s.CapEff |= 1 << 21 },
		"CapPrm":     func(s *Status) { s.CapPrm = 0 },
		"CapBnd":     func(s *Status) { s.CapBnd = 0 },
		"CapInh":     func(s *Status) { s.CapInh = 1 },
		"CapAmb":     func(s *Status) { s.CapAmb = 1 << 5 },
		"NoNewPrivs": func(s *Status) { s.NoNewPrivs = 1 },
	}
	for field, mutate := range cases {
		st := good
		mutate(&st)
		var te *ThreadError
		if err := verifyThread(7, st); !errors.As(err, &te) || te.Field != field || te.TID != 7 {
			t.Errorf("%s changed: got %v, want ThreadError naming %s", field, err, field)
		}
	}
}

// worldExecutableCopy copies the test binary where an unprivileged uid can
// execute it (go test builds it in a 0700 directory).
func worldExecutableCopy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // t.TempDir makes both 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "caps.test")
	if err := os.WriteFile(p, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// testNarrowInHelper runs Narrow in a re-executed test binary (it is
// irreversible) and checks every thread of it ends with exactly the seven.
func testNarrowInHelper(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=narrow")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("narrow helper: %v", err)
	}
	var got struct {
		Error   string          `json:"error"`
		Masks   map[string]bool `json:"masks"`
		Threads int             `json:"threads"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	want := "00000000000001eb 00000000000001eb 00000000000001eb 0000000000000000 0000000000000000 0"
	if got.Error != "<nil>" || len(got.Masks) != 1 || !got.Masks[want] || got.Threads < 2 {
		t.Fatalf("after Narrow: %+v, want every thread %q", got, want)
	}
}
