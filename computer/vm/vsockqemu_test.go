package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/vm/guest"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationQEMUTakesTheVhostDescriptor: QEMU started as boot
// starts it (guest.Config.ExtraFiles, the device's arguments from
// wireArgs) runs vhost's first ioctl on descriptor 3, the one the
// daemon passes: here /dev/null stands in for /dev/vhost-vsock (no host
// of this project's CI has the device), so the ioctl fails and QEMU
// says so. Control: without the descriptor QEMU fails earlier, on a
// descriptor it does not have. A real vhost-vsock guest is not run
// (docs/operations.md, SECURITY.md).
func TestIntegrationQEMUTakesTheVhostDescriptor(t *testing.T) {
	testenv.Require(t, "qemu")
	k, err := guest.KernelAt(guest.KernelDir(guest.KernelVMSuite))
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(t.TempDir(), "initrd")
	if err := os.WriteFile(initrd, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr := func(extra []*os.File) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		v, err := guest.Start(ctx, guest.Config{Kernel: k, Initramfs: initrd,
			Args: append([]string{"-S"}, vsockDeviceArgs(5, vhostFD)...), ExtraFiles: extra})
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		_, err = v.Wait(ctx)
		var ce *guest.ConsoleError
		if !errors.As(err, &ce) || ctx.Err() != nil {
			t.Fatalf("QEMU did not exit at the device: %v", err)
		}
		return ce.Stderr
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if s := stderr([]*os.File{null}); !strings.Contains(s, "vhost_set_owner") {
		t.Fatalf("QEMU did not run vhost's ioctl on the passed descriptor:\n%s", s)
	}
	if s := stderr(nil); strings.Contains(s, "vhost_set_owner") || !strings.Contains(s, "Bad file descriptor") {
		t.Fatalf("control: without the descriptor QEMU still reached vhost:\n%s", s)
	}
}

// TestIntegrationGuestKernelHasVsockModules: the guest kernel's module
// tree resolves the vsock set the guest loads for the vsock link, its
// dependencies ordered before it.
func TestIntegrationGuestKernelHasVsockModules(t *testing.T) {
	testenv.Require(t, "qemu")
	k, err := guest.KernelAt(guest.KernelDir(guest.KernelVMSuite))
	if err != nil {
		t.Fatal(err)
	}
	mods, err := guest.ResolveModules(k, wireModules(vmModules, LinkVsockPort))
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]int{}
	for i, m := range mods {
		at[m.Name] = i
	}
	tr, ok := at["vmw_vsock_virtio_transport"]
	if !ok {
		t.Fatalf("no vsock transport module in %v", at)
	}
	for _, dep := range mods[tr].Depends {
		if i, ok := at[dep]; ok && i > tr {
			t.Fatalf("%s is loaded after the transport that needs it", dep)
		}
	}
	t.Logf("vsock modules: %v", mods[tr].Depends)
}
