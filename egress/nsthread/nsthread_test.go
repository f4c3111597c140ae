package nsthread

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// netnsOf reads the network namespace of the given /proc task path.
func netnsOf(t *testing.T, task string) string {
	t.Helper()
	ns, err := os.Readlink(filepath.Join(task, "ns/net"))
	if err != nil {
		t.Fatalf("readlink: %v", err)
	}
	return ns
}

// TestInReturns: f runs in a new namespace (its listener is not the
// host's), and afterwards no thread of the process is left in it; the
// positive control is f's own view of the namespace.
func TestInReturns(t *testing.T) {
	testenv.Require(t, "root")
	host := netnsOf(t, "/proc/self")
	var inside string
	var ln net.Listener
	err := In(-1, func() error {
		inside = netnsOf(t, "/proc/thread-self")
		var err error
		ln, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	})
	if err != nil {
		t.Fatalf("In: %v", err)
	}
	defer ln.Close()
	if inside == host {
		t.Fatalf("f ran in the host's namespace %s", host)
	}
	// The listener lives in the new namespace: the host's loopback
	// does not reach it.
	if c, err := net.Dial("tcp4", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("the host reached %s, a listener of another namespace", ln.Addr())
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if ns := netnsOf(t, filepath.Join("/proc/self/task", task.Name())); ns == inside {
			t.Errorf("thread %s is still in %s", task.Name(), ns)
		}
	}
}

// TestInJoinsFd: In with a namespace file joins that namespace, and f's
// error comes back.
func TestInJoinsFd(t *testing.T) {
	testenv.Require(t, "root")
	var made string
	var keep *os.File
	if err := In(-1, func() error {
		made = netnsOf(t, "/proc/thread-self")
		var err error
		keep, err = os.Open("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatalf("In: %v", err)
	}
	defer keep.Close()
	boom := errors.New("boom")
	var seen string
	err := In(int(keep.Fd()), func() error {
		seen = netnsOf(t, "/proc/thread-self")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("In = %v, want f's error", err)
	}
	if seen != made {
		t.Fatalf("joined %s, want %s", seen, made)
	}
	if err := In(1<<20, func() error { return nil }); err == nil || !strings.Contains(err.Error(), "join") {
		t.Fatalf("In with a bad fd = %v, want a join failure", err)
	}
}

// TestLoopbackUp: in a fresh namespace lo is down and a connect to
// 127.0.0.1 fails (the positive control); after LoopbackUp it reaches a
// listener there.
func TestLoopbackUp(t *testing.T) {
	testenv.Require(t, "root")
	err := In(-1, func() error {
		if c, err := net.Dial("tcp4", "127.0.0.1:9"); err == nil {
			c.Close()
			t.Error("a connect on a down lo succeeded")
		}
		if err := LoopbackUp(); err != nil {
			return err
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		t.Fatalf("In: %v", err)
	}
}
