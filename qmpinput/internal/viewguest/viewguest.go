// Package viewguest boots the guest the live-view tests watch: a TCG VM
// with a bochs framebuffer console of a chosen size, a USB tablet, the
// PS/2 keyboard, evdump printing every evdev event to the serial console,
// a reader on tty1 so typed text is echoed on the screen, two QMP sockets
// (one for the code under test, one for the test's own probes) and QEMU's
// VNC server on a unix socket. It is test support: production code never
// imports it.
package viewguest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tetherdev/tether/fixtures/guest"
)

// VM is one booted view guest. Close stops QEMU and removes Dir.
type VM struct {
	*guest.VM
	Dir    string
	QMP    string // QMP socket for the code under test
	Probe  string // QMP socket for the test's own probes (query-status)
	VNC    string // QEMU's VNC server
	Width  int
	Height int
	seq    atomic.Uint64
}

// script runs in the guest after the modules are loaded. "draw TEXT"
// writes TEXT on row 3 of tty1 (the cursor is saved and restored, so echo
// of typed text keeps its place) and answers "drawn N"; "counter on"
// starts a counter on row 1 that counts five times a second and prints
// "count N" on the serial console; "counter off" stops it.
const script = `E=$(printf '\033')
evdump &
cat </dev/tty1 >/dev/null &
cpid=
while read -r cmd; do
	case "$cmd" in
	draw\ *) printf '%s7%s[3;1H%s[K%s%s8' "$E" "$E" "$E" "${cmd#draw }" "$E" > /dev/tty1; echo "drawn ${cmd#draw }";;
	counter\ on) (i=0; while :; do i=$((i+1)); printf '%s7%s[1;1Hcounter %08d%s8' "$E" "$E" $i "$E" > /dev/tty1; echo "count $i"; sleep 0.2; done) & cpid=$!; echo "counter started";;
	counter\ off) [ -n "$cpid" ] && kill $cpid; cpid=; echo "counter stopped";;
	esac
done`

// Boot builds the guest image and starts QEMU with a width x height
// screen, then waits until evdump has opened the tablet and the keyboard.
func Boot(ctx context.Context, width, height int) (*VM, error) {
	k, err := guest.FindKernel()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "viewguest-")
	if err != nil {
		return nil, err
	}
	v := &VM{Dir: dir, QMP: filepath.Join(dir, "qmp.sock"), Probe: filepath.Join(dir, "probe.sock"),
		VNC: filepath.Join(dir, "vnc.sock"), Width: width, Height: height}
	if err := v.start(ctx, k); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return v, nil
}

func (v *VM) start(ctx context.Context, k guest.Kernel) error {
	evdump := filepath.Join(v.Dir, "evdump")
	if err := guest.BuildGo(ctx, ".", "github.com/tetherdev/tether/qmpinput/internal/evdump", evdump); err != nil {
		return err
	}
	img, err := guest.Build(ctx, guest.Spec{
		Kernel:  k,
		Modules: append(append([]string{}, guest.ModulesUSBTablet...), "bochs"),
		Files:   []guest.File{{Path: "/bin/evdump", Source: evdump, Mode: 0o755}},
		Script:  script,
	}, filepath.Join(v.Dir, "initramfs.cpio"))
	if err != nil {
		return err
	}
	args := []string{"-device", fmt.Sprintf("VGA,id=video0,xres=%d,yres=%d", v.Width, v.Height),
		"-device", "qemu-xhci", "-device", "usb-tablet"}
	args = append(args, guest.QMPSocket(v.QMP)...)
	args = append(args, guest.QMPSocket(v.Probe)...)
	args = append(args, guest.VNCSocket(v.VNC)...)
	v.VM, err = guest.Start(ctx, guest.Config{Kernel: k, Initramfs: img.Path,
		Append: []string{"vt.global_cursor_default=0", "consoleblank=0"}, Args: args})
	if err != nil {
		return err
	}
	if err := v.WaitReady(ctx); err != nil {
		v.VM.Close()
		return err
	}
	return v.waitDevices(ctx)
}

func (v *VM) waitDevices(ctx context.Context) error {
	want := map[string]bool{"QEMU QEMU USB Tablet": true, "AT Translated Set 2 keyboard": true}
	open := regexp.MustCompile(`^evdump: open event\d+ name="(.*)"$`)
	for len(want) > 0 {
		line, err := v.WaitFor(ctx, open)
		if err != nil {
			v.VM.Close()
			return err
		}
		delete(want, open.FindStringSubmatch(line)[1])
	}
	return nil
}

// Close stops QEMU and removes the guest's directory.
func (v *VM) Close() {
	if v.VM != nil {
		v.VM.Close()
	}
	os.RemoveAll(v.Dir)
}

// Draw writes a fresh marker on row 3 of the guest's screen and returns
// once the guest has written it (its serial answer arrived). The marker
// is returned so callers can tell draws apart.
func (v *VM) Draw(ctx context.Context) (string, error) {
	marker := fmt.Sprintf("tether-view-%d-%d", time.Now().UnixNano()%1e6, v.seq.Add(1))
	if err := v.SendConsole("draw " + marker + "\n"); err != nil {
		return "", err
	}
	_, err := v.WaitFor(ctx, regexp.MustCompile(`^drawn `+regexp.QuoteMeta(marker)+`$`))
	return marker, err
}

// Counter starts or stops the on-screen counter and waits for the answer.
func (v *VM) Counter(ctx context.Context, on bool) error {
	cmd, ans := "counter off\n", "^counter stopped$"
	if on {
		cmd, ans = "counter on\n", "^counter started$"
	}
	if err := v.SendConsole(cmd); err != nil {
		return err
	}
	_, err := v.WaitFor(ctx, regexp.MustCompile(ans))
	return err
}

// Event is one evdev event evdump printed.
type Event struct{ Type, Code, Value int }

var evLine = regexp.MustCompile(`^evdump: event\d+ type=(\d+) code=(\d+) value=(-?\d+)$`)

// Linux input event types and codes the tests use
// (include/uapi/linux/input-event-codes.h).
const (
	EvKey   = 1
	EvAbs   = 3
	BtnLeft = 272
)

// Collect reads evdump events until stop returns true for one of them.
func (v *VM) Collect(ctx context.Context, stop func(Event) bool) ([]Event, error) {
	var out []Event
	for {
		line, err := v.WaitFor(ctx, evLine)
		if err != nil {
			return out, err
		}
		m := evLine.FindStringSubmatch(line)
		t, _ := strconv.Atoi(m[1])
		c, _ := strconv.Atoi(m[2])
		val, _ := strconv.Atoi(m[3])
		e := Event{t, c, val}
		out = append(out, e)
		if stop(e) {
			return out, nil
		}
	}
}

// EventsSince returns every evdump event printed in lines[from:], without
// moving any read cursor; with Mark it shows what reached the guest in a
// window.
func (v *VM) EventsSince(from int) []Event {
	var out []Event
	lines := v.Lines()
	for _, l := range lines[min(from, len(lines)):] {
		if m := evLine.FindStringSubmatch(l); m != nil {
			t, _ := strconv.Atoi(m[1])
			c, _ := strconv.Atoi(m[2])
			val, _ := strconv.Atoi(m[3])
			out = append(out, Event{t, c, val})
		}
	}
	return out
}

// Mark returns the current console position for EventsSince.
func (v *VM) Mark() int { return len(v.Lines()) }
