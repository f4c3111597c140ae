package vm

import (
	"errors"
	"runtime"
	"testing"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationLinkPortIsRootsAlone: the host's link port can be
// bound only with CAP_NET_BIND_SERVICE: a process of another uid (a
// thread of this test that left root, so holds no capability) is
// refused EACCES on it; positive control: that thread binds a port
// above 1023, and root binds the link port. A port a first listener
// holds makes listenLinks take the next one down (a second daemon).
// AF_VSOCK binds on a host without a guest (fixtures/testenv "vsock");
// nothing here connects.
func TestIntegrationLinkPortIsRootsAlone(t *testing.T) {
	testenv.Require(t, "root", "vsock")
	first, port, err := listenLinks()
	if err != nil {
		t.Fatalf("control: root binds the link port: %v", err)
	}
	defer first.Close()
	second, port2, err := listenLinks()
	if err != nil || port2 != port-1 {
		t.Fatalf("a second listener: port %d (first %d), %v", port2, port, err)
	}
	second.Close()

	type result struct{ low, high error }
	done := make(chan result)
	go func() {
		// WARNING: this thread changes its own uid and is never unlocked,
		// so it ends with the goroutine; run as root:
		// TETHER_TEST_REQUIRE=root,vsock go test ./computer/vm -run LinkPortIsRoots
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, 65534, 65534, 65534); e != 0 {
			done <- result{low: e, high: e}
			return
		}
		var r result
		if ln, err := vsock.ListenContextID(unix.VMADDR_CID_ANY, port-1, nil); err == nil {
			ln.Close()
		} else {
			r.low = err
		}
		if ln, err := vsock.ListenContextID(unix.VMADDR_CID_ANY, 40000+port, nil); err == nil {
			ln.Close()
		} else {
			r.high = err
		}
		done <- r
	}()
	r := <-done
	if !errors.Is(r.low, unix.EACCES) {
		t.Fatalf("another uid bound link port %d: %v, want EACCES", port-1, r.low)
	}
	if r.high != nil {
		t.Fatalf("control: another uid cannot bind a port above 1023 either: %v", r.high)
	}
}
