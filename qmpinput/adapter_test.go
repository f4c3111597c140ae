package qmpinput

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/tetherdev/tether/fixtures/testenv"
)

func testConfig(socket string) Config {
	return Config{Socket: socket, Display: Display{Device: "video0"}, TypeRate: 1000, TypeBurst: 100,
		PressHold: time.Millisecond, DoubleClickGap: time.Millisecond}
}

func openFake(t *testing.T, f *fakeQMP, mod func(*Config)) *Adapter {
	t.Helper()
	cfg := testConfig(f.path)
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestOpenRefusesNetworkAddresses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted sync.WaitGroup
	var n int
	accepted.Add(1)
	go func() {
		defer accepted.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n++
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	dir := t.TempDir()
	os.Symlink("/tmp", filepath.Join(dir, "link"))
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o600)
	for _, s := range []string{addr, "tcp:" + addr, "localhost:" + strings.Split(addr, ":")[1], "unix:" + dir + "/q.sock",
		"@abstract", "qmp.sock", dir + "/../x.sock", "", filepath.Join(dir, "link"), filepath.Join(dir, "file"), "vsock:3:4444"} {
		_, err := Open(context.Background(), testConfig(s))
		if !errors.Is(err, ErrNotUnixSocket) {
			t.Errorf("Open(%q) = %v, want ErrNotUnixSocket", s, err)
		}
	}
	ln.Close()
	accepted.Wait()
	if n != 0 {
		t.Fatalf("the TCP listener was dialled %d times", n)
	}
}

func TestOpenRefusesWrongOwner(t *testing.T) {
	testenv.Require(t, "root")
	f := newFakeQMP(t)
	other := uint32(60001)
	// The socket is root's; pin 60001.
	_, err := Open(ctx5(t), Config{Socket: f.path, Owner: &other, Display: Display{Device: "video0"}})
	var oe *OwnerError
	if !errors.As(err, &oe) || oe.What != "socket directory" && oe.What != "socket" {
		t.Fatalf("pinned 60001 on a root socket: %v", err)
	}
	// The socket file belongs to 60001 but the default pin is the euid (0).
	if err := os.Chown(f.path, int(other), -1); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx5(t), testConfig(f.path))
	if !errors.As(err, &oe) || oe.What != "socket" || oe.Got != other {
		t.Fatalf("socket owned by 60001, pin 0: %v", err)
	}
	// Socket file and directory say 60001, but the process listening is
	// root: the peer-credential check catches the lie.
	if err := os.Chown(filepath.Dir(f.path), int(other), -1); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx5(t), Config{Socket: f.path, Owner: &other, Display: Display{Device: "video0"}})
	if !errors.As(err, &oe) || oe.What != "peer process" || oe.Got != 0 {
		t.Fatalf("peer runs as root, pin 60001: %v", err)
	}
	if got := f.commands(); len(got) != 0 {
		t.Fatalf("a refused adapter sent %v", got)
	}
}

func TestOpenRefusesOpenModes(t *testing.T) {
	f := newFakeQMP(t)
	os.Chmod(f.path, 0o777)
	if _, err := Open(ctx5(t), testConfig(f.path)); !errors.Is(err, ErrSocketMode) {
		t.Fatalf("world-writable socket: %v", err)
	}
	os.Chmod(f.path, 0o700)
	os.Chmod(filepath.Dir(f.path), 0o777)
	if _, err := Open(ctx5(t), testConfig(f.path)); !errors.Is(err, ErrSocketMode) {
		t.Fatalf("world-writable directory: %v", err)
	}
	os.Chmod(filepath.Dir(f.path), os.ModeSticky|0o777) // sticky: others cannot replace the socket
	a, err := Open(ctx5(t), testConfig(f.path))
	if err != nil {
		t.Fatalf("sticky directory: %v", err)
	}
	a.Close()
}

func TestOpenRefusesVersionOutsideRange(t *testing.T) {
	f := newFakeQMP(t)
	f.setGreeting(`{"QMP": {"version": {"qemu": {"micro": 0, "minor": 0, "major": 7}, "package": ""}, "capabilities": []}}`)
	_, err := Open(ctx5(t), testConfig(f.path))
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Got != (Version{7, 0, 0}) {
		t.Fatalf("qemu 7.0.0 under the default range: %v", err)
	}
	f.setGreeting(greeting72)
	cfg := testConfig(f.path)
	cfg.Versions = VersionRange{Min: Version{6, 0, 0}, Max: Version{7, 2, 0}}
	if _, err := Open(ctx5(t), cfg); !errors.As(err, &ve) {
		t.Fatalf("qemu 7.2.0 with max 7.2.0 exclusive: %v", err)
	}
	for _, c := range f.commands() {
		t.Errorf("a refused version got command %s", c.Execute)
	}
}

func TestOpenRefusesMalformedGreeting(t *testing.T) {
	for _, g := range []string{`{}`, `{"QMP": {}}`, `not json`, `{"QMP": {"version": {"qemu": {"major": 7, "minor": 2}}}}`,
		greeting72 + ` {"x":1}`, `{"QMP": {"version": {"qemu": {"major": -1, "minor": 2, "micro": 0}}}, "extra": 1}`} {
		f := newFakeQMP(t)
		f.setGreeting(g)
		if _, err := Open(ctx5(t), testConfig(f.path)); !errors.Is(err, ErrProtocol) {
			t.Errorf("greeting %s: %v, want ErrProtocol", g, err)
		}
	}
}

// TestClosedCommandSet drives go-qemu's full generated command set at the
// adapter's transport: everything outside the closed set is refused before
// a byte reaches QEMU.
func TestClosedCommandSet(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	m := raw.NewMonitor(a.conn.bind(ctx5(t)))
	attempts := map[string]error{}
	_, attempts["human-monitor-command"] = m.HumanMonitorCommand("info registers", nil)
	attempts["migrate"] = m.Migrate("tcp:127.0.0.1:4444", nil, nil, nil)
	attempts["device_add"] = m.DeviceAdd("virtio-9p-pci", nil, nil)
	attempts["quit"] = m.Quit()
	attempts["qmp_capabilities again"] = m.QMPCapabilities()
	_, attempts["query-version"] = m.QueryVersion()
	_, attempts["raw bytes"] = a.conn.run(ctx5(t), []byte(`{"execute":"screendump","arguments":{},"execute":"quit"}`+"x"))
	for name, err := range attempts {
		if !errors.Is(err, ErrCommandNotAllowed) {
			t.Errorf("%s: %v, want ErrCommandNotAllowed", name, err)
		}
	}
	got := f.commands()
	if len(got) != 1 || got[0].Execute != "qmp_capabilities" {
		t.Fatalf("QEMU received %v, want only the handshake", got)
	}
}

func TestUnsupportedOperations(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	ctx := ctx5(t)
	_, e2 := a.ReadFile(ctx, "/etc/passwd")
	_, e4 := a.Clipboard(ctx)
	for i, err := range []error{a.Exec(ctx, []string{"sh"}), e2, a.WriteFile(ctx, "/x", nil), e4, a.SetClipboard(ctx, "x"), a.OpenURL(ctx, "https://example.com")} {
		if !errors.Is(err, ErrUnsupported) {
			t.Errorf("op %d: %v, want ErrUnsupported", i, err)
		}
	}
	if got := f.commands(); len(got) != 1 {
		t.Fatalf("unsupported operations reached QEMU: %v", got)
	}
}

func TestCallDeadlineClosesConnection(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	f.setHandler(func(cmd fakeCmd) []string { return []string{} }) // never answers
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := a.Capture(ctx)
	if !errors.Is(err, ErrDeadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Capture against a silent QEMU: %v, want ErrDeadline", err)
	}
	if _, err := a.Capture(ctx5(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after a deadline the adapter must be closed: %v", err)
	}
}

// TestSlowEventReaderCannotStallReplies floods events before a reply while
// a subscriber never reads them.
func TestSlowEventReaderCannotStallReplies(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	if _, err := a.conn.bind(ctx5(t)).Events(ctx5(t)); err != nil { // subscribe, never read
		t.Fatal(err)
	}
	const flood = 2000
	f.setHandler(func(cmd fakeCmd) []string {
		var lines []string
		for i := range flood {
			lines = append(lines, fmt.Sprintf(`{"event": "RTC_CHANGE", "data": {"offset": %d}, "timestamp": {"seconds": 1, "microseconds": 2}}`, i))
		}
		lines = append(lines, fmt.Sprintf(`{"return": {}, "id": %d}`, cmd.ID))
		return lines
	})
	setFakeFrame(640, 480, color.RGBA{1, 2, 3, 255})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cmd := []byte(`{"execute":"input-send-event","arguments":{"events":[]}}`)
	if _, err := a.conn.run(ctx, cmd); err != nil {
		t.Fatalf("reply behind %d unread events: %v", flood, err)
	}
	if d := a.EventsDropped(); d != flood-eventBuffer {
		t.Fatalf("dropped %d events, want %d", d, flood-eventBuffer)
	}
}

func TestReplyWithWrongIDIsFatal(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	f.setHandler(func(cmd fakeCmd) []string { return []string{fmt.Sprintf(`{"return": {}, "id": %d}`, cmd.ID+1)} })
	if _, err := a.Capture(ctx5(t)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("wrong id: %v, want ErrProtocol", err)
	}
	if _, err := a.Capture(ctx5(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after a protocol violation: %v, want ErrClosed", err)
	}
}

func TestQMPErrorKeepsClass(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	f.setHandler(func(cmd fakeCmd) []string {
		return []string{fmt.Sprintf(`{"error": {"class": "DeviceNotFound", "desc": "Device 'video0' not found"}, "id": %d}`, cmd.ID)}
	})
	_, err := a.Capture(ctx5(t))
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "DeviceNotFound" || qe.Command != "screendump" || !errors.Is(err, ErrCommandFailed) {
		t.Fatalf("got %v", err)
	}
}

// sentInputs decodes every input-send-event the fake received.
func sentInputs(t *testing.T, f *fakeQMP) []string {
	t.Helper()
	var out []string
	for _, c := range f.commands() {
		if c.Execute != "input-send-event" {
			continue
		}
		var args struct {
			Device string `json:"device"`
			Head   int    `json:"head"`
			Events []struct {
				Type string          `json:"type"`
				Data json.RawMessage `json:"data"`
			} `json:"events"`
		}
		if err := json.Unmarshal(c.Arguments, &args); err != nil {
			t.Fatal(err)
		}
		if args.Device != "video0" || args.Head != 0 {
			t.Fatalf("input not routed to the pinned display: %s", c.Arguments)
		}
		var evs []string
		for _, e := range args.Events {
			evs = append(evs, e.Type+string(e.Data))
		}
		out = append(out, strings.Join(evs, " "))
	}
	return out
}

func TestPointerNeedsCaptureAndBounds(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	ctx := ctx5(t)
	if err := a.Click(ctx, 1, 1, ButtonLeft); !errors.Is(err, ErrNoCapture) {
		t.Fatalf("click before capture: %v", err)
	}
	if err := a.Scroll(ctx, 1); !errors.Is(err, ErrNoCapture) {
		t.Fatalf("scroll before capture: %v", err)
	}
	if got := sentInputs(t, f); len(got) != 0 {
		t.Fatalf("input before capture reached QEMU: %v", got)
	}
	setFakeFrame(800, 600, color.RGBA{9, 9, 9, 255})
	if _, err := a.Capture(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]int{{800, 0}, {0, 600}, {-1, 5}, {5, -1}, {1 << 30, 1}} {
		var be *BoundsError
		if err := a.Move(ctx, p[0], p[1]); !errors.As(err, &be) || be.Width != 800 || be.Height != 600 {
			t.Errorf("move %v: %v, want BoundsError in 800x600", p, err)
		}
	}
	if err := a.Click(ctx, 799, 599, ButtonLeft); err != nil {
		t.Fatal(err)
	}
	got := sentInputs(t, f)
	want := []string{
		fmt.Sprintf(`abs{"axis":"x","value":%d} abs{"axis":"y","value":%d} btn{"button":"left","down":true}`, PixelToAbs(799, 800), PixelToAbs(599, 600)),
		`btn{"button":"left","down":false}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("sent:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestKeysAndTyping(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	ctx := ctx5(t)
	for _, bad := range []string{"sysrq", "power", "ctrl+alt+delete", "ctrl_r+alt+del", "a+b+c+d+e", "ctrl+ctrl", "", "ctrl+",
		"ctrl+ctrl_r+alt+delete", "ctrl+alt+shift+delete", "ctrl+alt+meta+delete", "ctrl+alt+shift+backspace",
		"alt_r+ctrl_r+backspace", "shift+shift_r", "meta_l+meta_r+a"} {
		if err := a.Key(ctx, bad); !errors.Is(err, ErrKeyNotAllowed) {
			t.Errorf("Key(%q) = %v, want ErrKeyNotAllowed", bad, err)
		}
	}
	for _, bad := range []string{"", "é", strings.Repeat("a", MaxTypeText+1), "ok\x00"} {
		if err := a.Type(ctx, bad); !errors.Is(err, ErrTextNotAllowed) {
			t.Errorf("Type(%q) = %v, want ErrTextNotAllowed", bad, err)
		}
	}
	if len(f.commands()) != 1 {
		t.Fatalf("refused keys reached QEMU: %v", f.commands())
	}
	if err := a.Key(ctx, "ctrl+alt+t"); err != nil {
		t.Fatal(err)
	}
	if err := a.Type(ctx, "A!"); err != nil {
		t.Fatal(err)
	}
	k := func(n string, down bool) string {
		return fmt.Sprintf(`key{"key":{"data":%q,"type":"qcode"},"down":%v}`, n, down)
	}
	want := []string{
		k("ctrl", true) + " " + k("alt", true) + " " + k("t", true),
		k("t", false) + " " + k("alt", false) + " " + k("ctrl", false),
		k("shift", true) + " " + k("a", true), k("a", false) + " " + k("shift", false),
		k("shift", true) + " " + k("1", true), k("1", false) + " " + k("shift", false),
	}
	if got := sentInputs(t, f); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("sent:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestTypingIsRateLimited(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, func(c *Config) { c.TypeRate, c.TypeBurst = 1, 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := a.Type(ctx, "abcdef")
	if err == nil {
		t.Fatal("six characters at 1/s went through in 300 ms")
	}
	if n := len(sentInputs(t, f)); n != 2 { // the burst of one: "a" down and up
		t.Fatalf("%d input commands sent, want 2 (one character)", n)
	}
}

func TestScrollBounds(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	for _, dy := range []int{0, MaxScroll + 1, -MaxScroll - 1} {
		if err := a.Scroll(ctx5(t), dy); !errors.Is(err, ErrScrollNotAllowed) {
			t.Errorf("Scroll(%d) = %v", dy, err)
		}
	}
	setFakeFrame(640, 480, color.RGBA{1, 2, 3, 255})
	if _, err := a.Capture(ctx5(t)); err != nil {
		t.Fatal(err)
	}
	if err := a.Scroll(ctx5(t), -2); err != nil {
		t.Fatal(err)
	}
	if got := sentInputs(t, f); len(got) != 4 || !strings.Contains(got[0], `"wheel-up","down":true`) || !strings.Contains(got[1], `"wheel-up","down":false`) {
		t.Fatalf("scroll sent %v", got)
	}
}

func TestCapturePoolDedupeAndLimit(t *testing.T) {
	f := newFakeQMP(t)
	now := time.Unix(1000, 0)
	var clock sync.Mutex
	a := openFake(t, f, func(c *Config) {
		c.PoolTTL = time.Minute
		c.Now = func() time.Time { clock.Lock(); defer clock.Unlock(); return now }
	})
	ctx := ctx5(t)
	setFakeFrame(640, 480, color.RGBA{1, 1, 1, 255})
	f1, err := a.Capture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(a.CaptureDir()); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("capture dir %v mode %v", err, st.Mode())
	}
	// Limit the pool to two frames of this size.
	a.pool.max = 2*int64(len(f1.PNG)) + 10
	f2, err := a.Capture(ctx)
	if err != nil || !f2.Deduped || f2.SHA256 != f1.SHA256 {
		t.Fatalf("identical frame: %+v %v, want deduped", f2, err)
	}
	if used, n := a.PoolUsage(); n != 1 || used != int64(len(f1.PNG)) {
		t.Fatalf("pool after dedupe: %d bytes, %d captures", used, n)
	}
	setFakeFrame(640, 480, color.RGBA{2, 2, 2, 255})
	if _, err := a.Capture(ctx); err != nil {
		t.Fatal(err)
	}
	setFakeFrame(640, 480, color.RGBA{3, 3, 3, 255})
	_, err = a.Capture(ctx)
	var pf *PoolFullError
	if !errors.As(err, &pf) {
		t.Fatalf("third distinct frame in a two-frame pool: %v, want PoolFullError", err)
	}
	if files, _ := os.ReadDir(a.CaptureDir()); len(files) != 2 {
		t.Fatalf("%d files in the capture dir after a refused capture, want 2", len(files))
	}
	if b, err := a.Retained(f1.SHA256); err != nil || string(b) != string(f1.PNG) {
		t.Fatalf("the recent capture was not kept: %v", err)
	}
	clock.Lock()
	now = now.Add(2 * time.Minute)
	clock.Unlock()
	if _, err := a.Capture(ctx); err != nil {
		t.Fatalf("after expiry the pool must make room: %v", err)
	}
	if _, n := a.PoolUsage(); n != 1 {
		t.Fatalf("pool holds %d captures after pruning, want 1", n)
	}
	dir := a.CaptureDir()
	a.Close()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left the capture dir: %v", err)
	}
}

func TestCaptureRefusesForgedFiles(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	for name, forge := range map[string]func(string) error{
		"symlink": func(p string) error { return os.Symlink("/etc/hostname", p) },
		"not png": func(p string) error { return os.WriteFile(p, []byte("GIF89a"), 0o644) },
		"fifo":    func(p string) error { return mkfifo(p) },
		"missing": func(p string) error { return nil },
	} {
		f.setHandler(func(cmd fakeCmd) []string {
			var args screendumpArgs
			json.Unmarshal(cmd.Arguments, &args)
			if err := forge(args.Filename); err != nil {
				t.Error(err)
			}
			return []string{fmt.Sprintf(`{"return": {}, "id": %d}`, cmd.ID)}
		})
		if _, err := a.Capture(ctx5(t)); !errors.Is(err, ErrCapture) {
			t.Errorf("%s: %v, want ErrCapture", name, err)
		}
	}
	t.Run("owned by another uid", func(t *testing.T) {
		testenv.Require(t, "root")
		f.setHandler(func(cmd fakeCmd) []string {
			var args screendumpArgs
			json.Unmarshal(cmd.Arguments, &args)
			if err := writeFakePNG(args.Filename); err != nil {
				t.Error(err)
			}
			if err := os.Chown(args.Filename, 60001, 60001); err != nil {
				t.Error(err)
			}
			return []string{fmt.Sprintf(`{"return": {}, "id": %d}`, cmd.ID)}
		})
		if _, err := a.Capture(ctx5(t)); !errors.Is(err, ErrCapture) || !strings.Contains(err.Error(), "not owned by") {
			t.Fatalf("a valid PNG owned by uid 60001: %v, want ErrCapture naming the owner", err)
		}
		f.setHandler(f.okScreendumpAndInput)
		if _, err := a.Capture(ctx5(t)); err != nil {
			t.Fatalf("the same PNG owned by QEMU's uid: %v", err)
		}
	})
}

func TestHandoverFencesAndMasks(t *testing.T) {
	f := newFakeQMP(t)
	var mu sync.Mutex
	var audit []AuditEvent
	a := openFake(t, f, func(c *Config) {
		c.Audit = func(e AuditEvent) { mu.Lock(); audit = append(audit, e); mu.Unlock() }
	})
	ctx := ctx5(t)
	setFakeFrame(640, 480, color.RGBA{5, 5, 5, 255})
	if _, err := a.Capture(ctx); err != nil {
		t.Fatal(err)
	}
	hold, err := a.Handover().Begin(time.Minute, "alice@example")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Handover().Begin(time.Minute, "bob"); !errors.Is(err, ErrHandoverActive) {
		t.Fatalf("second handover: %v", err)
	}
	before := len(f.commands())
	if err := a.Click(ctx, 1, 1, ButtonLeft); !errors.Is(err, ErrFenced) {
		t.Fatalf("click during handover: %v", err)
	}
	if err := a.Type(ctx, "secret"); !errors.Is(err, ErrFenced) {
		t.Fatalf("type during handover: %v", err)
	}
	if _, err := a.Capture(ctx); !errors.Is(err, ErrMasked) {
		t.Fatalf("capture during handover: %v", err)
	}
	if len(f.commands()) != before {
		t.Fatal("fenced calls reached QEMU")
	}
	hold.End()
	<-hold.Done()
	if hold.Reason() != EndExplicit {
		t.Fatalf("reason %q", hold.Reason())
	}
	if err := a.Click(ctx, 1, 1, ButtonLeft); !errors.Is(err, ErrNoCapture) {
		t.Fatalf("after a handover the old pixel space must be gone: %v", err)
	}
	if err := a.Scroll(ctx, -1); !errors.Is(err, ErrNoCapture) {
		t.Fatalf("scroll after a handover: %v", err)
	}
	if len(f.commands()) != before {
		t.Fatal("input after a handover reached QEMU before a new capture")
	}
	// TTL and revocation.
	h2, _ := a.Handover().Begin(20*time.Millisecond, "carol")
	<-h2.Done()
	h3, _ := a.Handover().Begin(time.Minute, "dave")
	a.Handover().Revoke()
	<-h3.Done()
	if h2.Reason() != EndTTL || h3.Reason() != EndRevoked {
		t.Fatalf("reasons %q %q", h2.Reason(), h3.Reason())
	}
	mu.Lock()
	defer mu.Unlock()
	kinds := []string{}
	for _, e := range audit {
		kinds = append(kinds, e.Kind+":"+e.Actor+":"+string(e.Reason))
		if e.Scope != "input+capture display=video0/0" {
			t.Errorf("scope %q", e.Scope)
		}
		if b, _ := json.Marshal(e); strings.Contains(string(b), "secret") {
			t.Errorf("audit carries content: %s", b)
		}
	}
	want := "handover_begin:alice@example: handover_end:alice@example:explicit handover_begin:carol: handover_end:carol:ttl handover_begin:dave: handover_end:dave:revoked"
	if strings.Join(kinds, " ") != want {
		t.Fatalf("audit %v\nwant %s", kinds, want)
	}
}

func TestHandoverNeedsAudit(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	if _, err := a.Handover().Begin(time.Minute, "x"); !errors.Is(err, ErrConfig) {
		t.Fatalf("handover without audit: %v", err)
	}
}

// TestHandoverStopsTypingMidText: a handover that begins while the agent
// types stops the text at the next character, and no key is left down.
func TestHandoverStopsTypingMidText(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, func(c *Config) {
		c.TypeRate, c.TypeBurst = 50, 1
		c.Audit = func(AuditEvent) {}
	})
	done := make(chan error, 1)
	go func() { done <- a.Type(context.Background(), strings.Repeat("x", 100)) }()
	for len(sentInputs(t, f)) < 4 { // at least two characters went through
		time.Sleep(5 * time.Millisecond)
	}
	hold, err := a.Handover().Begin(time.Minute, "alice")
	if err != nil {
		t.Fatal(err)
	}
	defer hold.End()
	n := len(sentInputs(t, f))
	if err := <-done; !errors.Is(err, ErrFenced) {
		t.Fatalf("Type across a handover: %v, want ErrFenced", err)
	}
	sent := sentInputs(t, f)
	if len(sent) != n {
		t.Fatalf("%d input commands after Begin returned", len(sent)-n)
	}
	if len(sent) >= 200 || len(sent)%2 != 0 {
		t.Fatalf("%d commands: typing did not stop, or a key was left down", len(sent))
	}
	for i := 0; i < len(sent); i += 2 {
		if !strings.Contains(sent[i], `"down":true`) || !strings.Contains(sent[i+1], `"down":false`) {
			t.Fatalf("command %d/%d is not a down/up pair: %s / %s", i, i+1, sent[i], sent[i+1])
		}
	}
}
