package qmpinput

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/guest"
	"github.com/tetherdev/tether/fixtures/ports"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// testVM is one guest shared by every QEMU test and benchmark of the
// package: a 1920x1080 bochs framebuffer (video0), a USB tablet, the PS/2
// keyboard, evdump printing input events to the serial console, and three
// QMP monitors: the adapter's socket, a baseline socket for go-qemu's
// plain SocketMonitor, and a TCP monitor the adapter must refuse.
type testVM struct {
	vm      *guest.VM
	dir     string
	qmp     string
	base    string
	tcpAddr string
}

var shared struct {
	once sync.Once
	vm   *testVM
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.vm != nil {
		shared.vm.vm.Close()
		os.RemoveAll(shared.vm.dir)
	}
	os.Exit(code)
}

// sharedVM boots the guest once and returns it ready: modules loaded and
// both input devices opened by evdump.
func sharedVM(tb testing.TB) *testVM {
	tb.Helper()
	testenv.Require(tb, "qemu")
	shared.once.Do(func() { shared.vm, shared.err = bootVM() })
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.vm
}

func bootVM() (*testVM, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	k, err := guest.FindKernel()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "qmpinput-vm-")
	if err != nil {
		return nil, err
	}
	tv := &testVM{dir: dir, qmp: filepath.Join(dir, "qmp.sock"), base: filepath.Join(dir, "base.sock")}
	evdump := filepath.Join(dir, "evdump")
	if err := guest.BuildGo(ctx, ".", "./internal/evdump", evdump); err != nil {
		return nil, err
	}
	img, err := guest.Build(ctx, guest.Spec{
		Kernel:  k,
		Modules: append(append([]string{}, guest.ModulesUSBTablet...), "bochs"),
		Files:   []guest.File{{Path: "/bin/evdump", Source: evdump, Mode: 0o755}},
		Script: `evdump &
while read -r cmd; do
	case "$cmd" in
	draw\ *) echo "${cmd#draw }" > /dev/tty1; echo "drawn";;
	esac
done`,
	}, filepath.Join(dir, "initramfs.cpio"))
	if err != nil {
		return nil, err
	}
	port, err := ports.Pick() // below the ephemeral range: QEMU binds it next
	if err != nil {
		return nil, err
	}
	tv.tcpAddr = fmt.Sprintf("127.0.0.1:%d", port)
	tv.vm, err = guest.Start(ctx, guest.Config{
		Kernel: k, Initramfs: img.Path,
		Append: []string{"vt.global_cursor_default=0", "consoleblank=0"},
		Args: []string{
			"-device", "VGA,id=video0,xres=1920,yres=1080",
			"-device", "qemu-xhci", "-device", "usb-tablet",
			"-qmp", "unix:" + tv.qmp + ",server=on,wait=off",
			"-qmp", "unix:" + tv.base + ",server=on,wait=off",
			"-qmp", "tcp:" + tv.tcpAddr + ",server=on,wait=off",
		},
	})
	if err != nil {
		return nil, err
	}
	if err := tv.vm.WaitReady(ctx); err != nil {
		tv.vm.Close()
		return nil, err
	}
	want := map[string]bool{"QEMU QEMU USB Tablet": true, "AT Translated Set 2 keyboard": true}
	open := regexp.MustCompile(`^evdump: open event\d+ name="(.*)"$`)
	for len(want) > 0 {
		line, err := tv.vm.WaitFor(ctx, open)
		if err != nil {
			tv.vm.Close()
			return nil, err
		}
		delete(want, open.FindStringSubmatch(line)[1])
	}
	return tv, nil
}

// evEvent is one line evdump printed.
type evEvent struct{ typ, code, value int }

var evLine = regexp.MustCompile(`^evdump: event\d+ type=(\d+) code=(\d+) value=(-?\d+)$`)

// collect reads evdump events until stop returns true for one of them.
func (tv *testVM) collect(ctx context.Context, stop func(evEvent) bool) ([]evEvent, error) {
	var out []evEvent
	for {
		line, err := tv.vm.WaitFor(ctx, evLine)
		if err != nil {
			return out, err
		}
		m := evLine.FindStringSubmatch(line)
		t, _ := strconv.Atoi(m[1])
		c, _ := strconv.Atoi(m[2])
		v, _ := strconv.Atoi(m[3])
		e := evEvent{t, c, v}
		out = append(out, e)
		if stop(e) {
			return out, nil
		}
	}
}

func openReal(tb testing.TB, tv *testVM, mod func(*Config)) *Adapter {
	tb.Helper()
	cfg := Config{Socket: tv.qmp, Display: Display{Device: "video0"}}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := Open(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close() })
	return a
}
