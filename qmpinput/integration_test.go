package qmpinput

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"image/png"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// Linux input codes (include/uapi/linux/input-event-codes.h).
const (
	evKey, evRel, evAbs      = 1, 2, 3
	absX, absY, relWheel     = 0, 1, 8
	btnLeft, btnRight        = 272, 273
	keyLeftCtrl, keyLeftAlt  = 29, 56
	keyLeftShift, keyT, keyH = 42, 20, 35
	keyI, key1               = 23, 2
)

// TestIntegrationQEMUInput sends clicks at known pixels and keys through
// the adapter and checks what the guest's evdev devices received.
func TestIntegrationQEMUInput(t *testing.T) {
	tv := sharedVM(t)
	a := openReal(t, tv, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := a.Capture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f.Width != 1920 || f.Height != 1080 {
		t.Fatalf("capture is %dx%d, want the guest's 1920x1080", f.Width, f.Height)
	}
	t.Run("clicks land on the pixel", func(t *testing.T) {
		// evdev drops an axis event that repeats the axis's current value
		// (0 at start), so every point differs from the one before it.
		for i, p := range [][2]int{{960, 540}, {0, 0}, {1919, 1079}, {123, 457}, {1, 1}} {
			btn, code := ButtonLeft, btnLeft
			if i == 0 {
				btn, code = ButtonRight, btnRight
			}
			if err := a.Click(ctx, p[0], p[1], btn); err != nil {
				t.Fatal(err)
			}
			evs, err := tv.collect(ctx, func(e evEvent) bool { return e == evEvent{evKey, code, 0} })
			if err != nil {
				t.Fatal(err)
			}
			checkClick(t, p, evs, code, f.Width, f.Height)
		}
	})
	t.Run("double click and scroll", func(t *testing.T) {
		if err := a.DoubleClick(ctx, 400, 300); err != nil {
			t.Fatal(err)
		}
		ups := 0
		if _, err := tv.collect(ctx, func(e evEvent) bool {
			if e == (evEvent{evKey, btnLeft, 0}) {
				ups++
			}
			return ups == 2
		}); err != nil {
			t.Fatal(err)
		}
		if err := a.Scroll(ctx, -1); err != nil {
			t.Fatal(err)
		}
		if _, err := tv.collect(ctx, func(e evEvent) bool { return e == evEvent{evRel, relWheel, 1} }); err != nil {
			t.Fatal("wheel up never reached the guest: ", err)
		}
	})
	t.Run("keys", func(t *testing.T) {
		if err := a.Key(ctx, "ctrl+alt+t"); err != nil {
			t.Fatal(err)
		}
		checkKeys(t, tv, ctx, []evEvent{{evKey, keyLeftCtrl, 1}, {evKey, keyLeftAlt, 1}, {evKey, keyT, 1},
			{evKey, keyT, 0}, {evKey, keyLeftAlt, 0}, {evKey, keyLeftCtrl, 0}})
		if err := a.Type(ctx, "Hi1"); err != nil {
			t.Fatal(err)
		}
		checkKeys(t, tv, ctx, []evEvent{{evKey, keyLeftShift, 1}, {evKey, keyH, 1}, {evKey, keyH, 0}, {evKey, keyLeftShift, 0},
			{evKey, keyI, 1}, {evKey, keyI, 0}, {evKey, key1, 1}, {evKey, key1, 0}})
	})
	t.Run("out of bounds never reaches the guest", func(t *testing.T) {
		if err := a.Click(ctx, 1920, 5, ButtonLeft); !errors.Is(err, ErrOutOfBounds) {
			t.Fatalf("click at x=1920 of 1920: %v", err)
		}
	})
}

func checkClick(t *testing.T, p [2]int, evs []evEvent, code, w, h int) {
	t.Helper()
	var gotX, gotY = -1, -1
	down := false
	for _, e := range evs {
		switch e {
		case evEvent{evKey, code, 1}:
			down = true
		}
		if e.typ == evAbs && e.code == absX {
			gotX = e.value
		}
		if e.typ == evAbs && e.code == absY {
			gotY = e.value
		}
	}
	wantX, wantY := PixelToAbs(p[0], w), PixelToAbs(p[1], h)
	if gotX != wantX || gotY != wantY || !down {
		t.Fatalf("click at %v: guest saw abs (%d,%d) down=%v, want (%d,%d) down=true; events %v", p, gotX, gotY, down, wantX, wantY, evs)
	}
	if AbsToPixel(gotX, w) != p[0] || AbsToPixel(gotY, h) != p[1] {
		t.Fatalf("click at %v: guest maps back to (%d,%d)", p, AbsToPixel(gotX, w), AbsToPixel(gotY, h))
	}
}

func checkKeys(t *testing.T, tv *testVM, ctx context.Context, want []evEvent) {
	t.Helper()
	last := want[len(want)-1]
	evs, err := tv.collect(ctx, func(e evEvent) bool { return e == last })
	if err != nil {
		t.Fatal(err)
	}
	var got []evEvent
	for _, e := range evs {
		if e.typ == evKey { // the wheel's hi-res REL events may trail in
			got = append(got, e)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("guest saw keys %v, want %v", got, want)
	}
}

// TestIntegrationQEMUCapture: a capture is a PNG of the guest's size whose
// SHA-256 stays put while the screen is still and changes when the guest
// draws.
func TestIntegrationQEMUCapture(t *testing.T) {
	tv := sharedVM(t)
	a := openReal(t, tv, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f1, err := a.Capture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(f1.PNG))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(f1.PNG)
	if b := img.Bounds(); b.Dx() != 1920 || b.Dy() != 1080 || f1.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("capture %dx%d sha %s", b.Dx(), b.Dy(), f1.SHA256)
	}
	f2, err := a.Capture(ctx)
	if err != nil || !f2.Deduped || f2.SHA256 != f1.SHA256 {
		t.Fatalf("still screen: %+v %v, want the same frame deduplicated", f2, err)
	}
	if err := tv.vm.SendConsole(fmt.Sprintf("draw tether was here %d\n", time.Now().UnixNano())); err != nil {
		t.Fatal(err)
	}
	if _, err := tv.vm.WaitFor(ctx, regexp.MustCompile(`^drawn$`)); err != nil {
		t.Fatal(err)
	}
	f3, err := a.Capture(ctx)
	if err != nil || f3.SHA256 == f1.SHA256 || f3.Deduped {
		t.Fatalf("after the guest drew: %v, sha unchanged=%v", err, f3.SHA256 == f1.SHA256)
	}
	st, err := os.Stat(a.CaptureDir())
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("capture dir: %v %v", st.Mode(), err)
	}
}

// TestIntegrationQEMUPinning: real QEMU refused for its version, its
// socket's owner, a TCP address, and every command outside the set.
func TestIntegrationQEMUPinning(t *testing.T) {
	tv := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Run("version outside range", func(t *testing.T) {
		// Read the running version first, so any QEMU release keeps this test
		// meaningful: the range is pinned just above it, then just below.
		a, err := Open(ctx, Config{Socket: tv.qmp, Display: Display{Device: "video0"}})
		if err != nil {
			t.Fatal(err)
		}
		running := a.Greeting().Version
		a.Close()
		above := Version{running.Major, running.Minor, running.Micro + 1}
		for _, r := range []VersionRange{{Min: above}, {Min: DefaultVersions.Min, Max: running}} {
			_, err := Open(ctx, Config{Socket: tv.qmp, Display: Display{Device: "video0"}, Versions: r})
			var ve *VersionError
			if !errors.As(err, &ve) || ve.Got != running {
				t.Fatalf("QEMU %s with range %s: %v, want a VersionError naming %s", running, r, err, running)
			}
		}
	})
	t.Run("tcp address", func(t *testing.T) {
		// The TCP monitor is real and reachable: the refusal is the pin's.
		c, err := net.DialTimeout("tcp", tv.tcpAddr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 512)
		n, _ := c.Read(buf)
		c.Close()
		if !strings.Contains(string(buf[:n]), `"QMP"`) {
			t.Fatalf("TCP monitor greeting %q", buf[:n])
		}
		for _, addr := range []string{tv.tcpAddr, "tcp:" + tv.tcpAddr} {
			if _, err := Open(ctx, Config{Socket: addr, Display: Display{Device: "video0"}}); !errors.Is(err, ErrNotUnixSocket) {
				t.Fatalf("Open(%q) = %v, want ErrNotUnixSocket", addr, err)
			}
		}
	})
	t.Run("socket owner", func(t *testing.T) {
		testenv.Require(t, "root")
		other := uint32(60001)
		var oe *OwnerError
		if _, err := Open(ctx, Config{Socket: tv.qmp, Owner: &other, Display: Display{Device: "video0"}}); !errors.As(err, &oe) {
			t.Fatalf("pin 60001 on QEMU's root socket: %v", err)
		}
		if err := os.Chown(tv.qmp, int(other), -1); err != nil {
			t.Fatal(err)
		}
		defer os.Chown(tv.qmp, 0, -1)
		if _, err := Open(ctx, Config{Socket: tv.qmp, Display: Display{Device: "video0"}}); !errors.As(err, &oe) || oe.Got != other {
			t.Fatalf("socket chowned to 60001, pin root: %v", err)
		}
	})
	t.Run("closed command set", func(t *testing.T) {
		a := openReal(t, tv, nil)
		m := raw.NewMonitor(a.conn.bind(ctx))
		_, e1 := m.HumanMonitorCommand("quit", nil)
		for _, err := range []error{e1, m.Quit(), m.Migrate("exec:true", nil, nil, nil), m.DeviceAdd("usb-kbd", nil, nil)} {
			if !errors.Is(err, ErrCommandNotAllowed) {
				t.Fatalf("got %v, want ErrCommandNotAllowed", err)
			}
		}
		if _, err := a.Capture(ctx); err != nil {
			t.Fatalf("QEMU must still be running after the refused quit: %v", err)
		}
	})
}
