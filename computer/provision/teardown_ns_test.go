package provision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/admission"
)

// TestIntegrationTeardownRemovesEverything: after a command left a
// setsid escapee, System V IPC objects, a file on the disk and processes
// in every cgroup, Close removes everything the grant's uid owned, both
// after a clean stop and after the receiver was SIGKILLed first, and each
// is checked: no process of the uid; the cgroup2 parent and the v1
// cgroups gone; no mount left under the computer's directory, the loop
// device released, the computer's mount, PID and IPC namespaces held by
// no process; no IPC object of the uid; the directory gone.
func TestIntegrationTeardownRemovesEverything(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "stopped", true: "receiver_sigkilled"}[kill], func(t *testing.T) {
			c := isolated(t, Options{Limits: limitsForTeardown})
			id, wc := startIn(t, c, `setsid sleep 300 & ipcmk -M 1048576 && ipcmk -Q && ipcmk -S 2 && dd if=/dev/zero of=f bs=1M count=4 2>/dev/null; echo ready; sleep 300`)
			awaitOutput(t, c, wc, id, "ready")
			wc.Close()
			s := c.State()
			nss := map[string]string{}
			for _, kind := range []string{"mnt", "pid", "ipc"} {
				l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", s.ReceiverPID, kind))
				if err != nil {
					t.Fatal(err)
				}
				nss[kind] = l
			}
			before := nowTicks(t) // every process of the computer started before this
			if kill {
				if err := syscall.Kill(s.ReceiverPID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}
			checkNothingLeft(t, s, nss, before)
		})
	}
}

// TestIntegrationTeardownReleasesDiskCopiedIntoANamespace: a process that
// made its own mount namespace (slave propagation, as the agent jail and
// bubblewrap do) while the computer ran got a copy of the computer's
// root; Close still unmounts it there and releases the loop device,
// instead of reporting the device as a leftover for as long as that
// process lives.
func TestIntegrationTeardownReleasesDiskCopiedIntoANamespace(t *testing.T) {
	c := isolated(t, Options{Limits: limitsForTeardown})
	s := c.State()
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), holdNamespaceEnv+"=1")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	hold, err := holder.StdinPipe() // the holder lives until this closes
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Close(); holder.Process.Kill(); holder.Wait() })
	ready := make([]byte, 6)
	if _, err := io.ReadFull(out, ready); err != nil || string(ready) != "ready\n" {
		t.Fatalf("the namespace holder did not start: %q %v", ready, err)
	}
	mi := fmt.Sprintf("/proc/%d/mountinfo", holder.Process.Pid)
	if b, err := os.ReadFile(mi); err != nil || !strings.Contains(string(b), " "+s.Dir+"/root ") {
		t.Fatalf("the holder's namespace has no copy of the root (%v):\n%s", err, b)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close with the root copied into another namespace: %v", err)
	}
	if loopBacks(s.Disk.Loop, s.Disk.Image) {
		t.Errorf("%s still holds %s", s.Disk.Loop, s.Disk.Image)
	}
	b, err := os.ReadFile(mi)
	if err != nil {
		t.Fatalf("the holder's namespace is gone, so nothing was shown: %v", err)
	}
	if strings.Contains(string(b), " "+s.Dir+"/") {
		t.Errorf("the holder's namespace still has a mount under %s:\n%s", s.Dir, b)
	}
}

// holdNamespaceEnv makes the test binary a namespace holder: in the mount
// namespace it was started in, it makes every mount a slave of the host's
// (MS_REC|MS_SLAVE, as the agent jail does), says ready and waits until
// its stdin closes. The wait is a blocking read: a `select {}` is a
// deadlock the runtime ends at once in a binary built without cgo
// (CGO_ENABLED=0), and the holder died right after saying ready.
const holdNamespaceEnv = "TETHER_TEST_HOLD_NAMESPACE"

func holdNamespaceMain() {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// limitsForTeardown keep the teardown test's disk small.
var limitsForTeardown = admissionLimits(64 << 20)

// checkNothingLeft checks that nothing of the computer described by s
// remains on the host.
func checkNothingLeft(t *testing.T, s State, nss map[string]string, before uint64) {
	t.Helper()
	if ps, err := ProcessesOf(s.UID); err != nil || len(ps) != 0 {
		t.Errorf("processes of uid %d: %+v %v", s.UID, ps, err)
	}
	for _, d := range append([]string{s.CgroupParent}, s.LimitCgroups...) {
		if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left: %v", d, err)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || strings.Contains(string(mi), " "+s.Dir+"/") {
		t.Errorf("a mount under %s is left (%v)", s.Dir, err)
	}
	if s.Disk == nil || s.Disk.Loop == "" || loopBacks(s.Disk.Loop, s.Disk.Image) {
		t.Errorf("disk %+v: the loop device still holds the image", s.Disk)
	}
	for kind, ns := range nss {
		if h := nsHolders(t, kind, ns, before); len(h) != 0 {
			t.Errorf("the computer's %s namespace %s is held by %v", kind, ns, h)
		}
	}
	if objs, err := IPCObjectsOf(s.UID); err != nil || len(objs) != 0 {
		t.Errorf("IPC objects of uid %d: %+v %v", s.UID, objs, err)
	}
	if _, err := os.Lstat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left: %v", s.Dir, err)
	}
}

func admissionLimits(disk int64) admission.Limits { return admission.Limits{MaxDiskBytes: disk} }

// TestIntegrationNamespacedReceiver: the namespaced computer's receiver
// is PID 1 of its own PID namespace, in mount, network, IPC and UTS
// namespaces that are not this process's, with exactly its seven
// capabilities (effective, permitted and bounding 00000000000001eb, the
// stage's others gone), and the limits in its hard resource limits.
func TestIntegrationNamespacedReceiver(t *testing.T) {
	c := isolated(t, Options{Limits: admission.Limits{MaxDiskBytes: 64 << 20, MaxPids: 300, MaxOpenFiles: 2048}})
	pid := c.State().ReceiverPID
	for _, kind := range []string{"mnt", "pid", "net", "ipc", "uts"} {
		mine, _ := os.Readlink("/proc/self/ns/" + kind)
		its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
		if err != nil || its == mine {
			t.Errorf("the receiver's %s namespace %q (%v) is this process's %q", kind, its, err, mine)
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nNSpid:\t" + strconv.Itoa(pid) + "\t1\n", "\nCapEff:\t00000000000001eb\n",
		"\nCapPrm:\t00000000000001eb\n", "\nCapBnd:\t00000000000001eb\n", "\nCapInh:\t0000000000000000\n", "\nCapAmb:\t0000000000000000\n"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("receiver status lacks %q", strings.TrimSpace(want))
		}
	}
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`Max processes\s+300\s+300\s`, `Max open files\s+2048\s+2048\s`,
		`Max file size\s+1073741824\s+1073741824\s`} {
		if !regexp.MustCompile(want).Match(limits) {
			t.Errorf("receiver limits lack %q:\n%s", want, limits)
		}
	}
}

// TestNowTicksOrdersProcessStarts: nowTicks counts in the unit and from
// the origin of /proc/PID/stat's start time, which nsHolders compares it
// with: a child started between two readings starts within them, and this
// process started before both.
func TestNowTicksOrdersProcessStarts(t *testing.T) {
	self, err := StartTicks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	before := nowTicks(t)
	child := exec.Command("sleep", "5")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	after := nowTicks(t)
	start, err := StartTicks(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if start < before || start > after || self > before {
		t.Fatalf("child started at tick %d, outside [%d, %d]; this process at %d", start, before, after, self)
	}
}
