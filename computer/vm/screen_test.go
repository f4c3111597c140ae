package vm

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/fixtures/browser"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/statedir"
)

// TestIntegrationVMScreen: a create with screen through the service
// gives a VM computer with a display: QEMU's VNC and the view's QMP
// socket are QEMU's, in its directory; the owner's control link opens
// in chromium (Debian's, through chromedp), the page shows the guest's
// console and its changes, take over sends typed keys to the guest
// (echoed on its screen), and a suspend shows on the page as the
// service's pause. Another owner's link request is not_found and mints
// nothing. After delete the view's port refuses, QEMU, the sockets and
// the directory are gone, and the view's audit log is in the records
// with an intact chain.
func TestIntegrationVMScreen(t *testing.T) {
	testenv.Require(t, "root", "qemu", "browser")
	p, base := testProvisioner(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := openTierService(t, ctx, p, base)
	defer s.Close()
	alice, bob := api.Caller{Owner: "alice"}, api.Caller{Owner: "bob"}
	start := time.Now()
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Screen: true, Limits: api.Limits{MemoryBytes: 192 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("BENCH create with a screen, TCG cold boot, through the service: %s", time.Since(start).Round(time.Millisecond))
	if !c.Screen {
		t.Fatalf("the computer does not say screen: %+v", c)
	}
	dir := filepath.Join(base, "svc", "computers", c.ID)
	st := vmState(t, dir)
	checkScreenSockets(t, dir, st)
	if _, err := s.Link(ctx, bob, c.ID, api.LinkRequest{Role: api.LinkRoleControl}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("bob's link to alice's screen = %v, want not_found", err)
	}
	l, err := s.Link(ctx, alice, c.ID, api.LinkRequest{Role: api.LinkRoleControl, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	origin := checkLoopback(t, l.Link)

	b := browser.New(t, ScreenWidth, ScreenHeight+200)
	b.OpenView(t, l.Link)
	// The banner's first four text rows (16 px each) hold about 150
	// characters: thousands of lit pixels, where a blinking cursor
	// alone lights a few dozen. Typed keys echo in the rows below it.
	t.Run("the console is on the screen", func(t *testing.T) {
		b.Poll(t, "the banner's pixels", browser.LitOver(0, 0, ScreenWidth, 64, 1000), 60*time.Second)
	})
	t.Run("take over types on the guest's console", func(t *testing.T) {
		b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#takeover")))
		b.Poll(t, "the hold", `tetherView.state.holder_is_you === true`, 30*time.Second)
		if lit := browser.Eval[string](t, b, browser.CanvasHash(0, 64, 400, 64)); browser.LitCount(lit) > 64 {
			t.Fatalf("the rows below the banner are lit before anything was typed: %s", lit)
		}
		b.Do(t, 20*time.Second, chromedp.KeyEvent("hello tether"))
		b.Poll(t, "the echoed text on the canvas", browser.LitOver(0, 64, 400, 64, 200), 30*time.Second)
		b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#handback")))
		b.Poll(t, "the hand back", `tetherView.state.holder === ""`, 30*time.Second)
	})
	t.Run("suspend shows as the service's pause", func(t *testing.T) {
		if eval := browser.Eval[string](t, b, `String(document.getElementById("pause").hidden)`); eval != "true" {
			t.Fatalf("the page offers pause on a service's computer")
		}
		if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
			t.Fatal(err)
		}
		b.Poll(t, "the paused state", fmt.Sprintf(`tetherView.state.paused === true && tetherView.state.paused_by === %q`, ScreenPauser), 30*time.Second)
		if _, err := s.Resume(ctx, alice, c.ID); err != nil {
			t.Fatal(err)
		}
		b.Poll(t, "the running state", `tetherView.state.paused === false`, 30*time.Second)
	})
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	checkGone(t, p, dir, st)
	if conn, err := net.DialTimeout("tcp", origin, time.Second); err == nil {
		conn.Close()
		t.Fatalf("the view still listens on %s after delete", origin)
	}
	got, err := s.Get(ctx, alice, c.ID)
	if err != nil || got.Records == "" {
		t.Fatalf("after delete: %+v %v, want records", got, err)
	}
	checkScreenAudit(t, filepath.Join(got.Records, "screen"))
}

// checkScreenSockets: the VNC and the view's QMP sockets are QEMU's uid's,
// in its 0700 directory, and QEMU was given the display.
func checkScreenSockets(t *testing.T, dir string, st state) {
	t.Helper()
	for _, name := range []string{"vnc.sock", "view-qmp.sock"} {
		var s syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(dir, "qemu", name), &s); err != nil {
			t.Fatal(err)
		}
		if s.Mode&syscall.S_IFMT != syscall.S_IFSOCK || s.Uid != st.QEMUUID {
			t.Fatalf("%s: mode %o uid %d, want a socket of QEMU's uid %d", name, s.Mode, s.Uid, st.QEMUUID)
		}
	}
	if args := qemuArgv(t, st.QEMUPID); !slices.Contains(args, "-vnc") || !strings.Contains(strings.Join(args, " "), "VGA,id="+screenDevice) {
		t.Fatalf("QEMU runs without the display: %q", args)
	}
}

// checkNoScreen: a computer made without a screen has no display, VNC
// or second QMP socket.
func checkNoScreen(t *testing.T, dir string) {
	t.Helper()
	st := vmState(t, dir)
	args := strings.Join(qemuArgv(t, st.QEMUPID), " ")
	if strings.Contains(args, "-vnc") || strings.Contains(args, "VGA") || strings.Contains(args, "usb-tablet") {
		t.Fatalf("QEMU of a computer without a screen has display devices: %s", args)
	}
	for _, name := range []string{"vnc.sock", "view-qmp.sock", "../screen"} {
		if _, err := os.Lstat(filepath.Join(dir, "qemu", name)); err == nil {
			t.Fatalf("a computer without a screen has %s", name)
		}
	}
}

func qemuArgv(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// checkLoopback returns the link's host:port, which must be loopback.
func checkLoopback(t *testing.T, link string) string {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil || u.Scheme != "http" || u.Hostname() != "127.0.0.1" || !strings.HasPrefix(u.Fragment, "t=") {
		t.Fatalf("link %q: want http://127.0.0.1:PORT/#t=SECRET", link)
	}
	return u.Host
}

// checkScreenAudit verifies the kept audit log's chain and that it
// recorded the mint, the viewer, the hold and the service's pause.
func checkScreenAudit(t *testing.T, p string) {
	t.Helper()
	d, err := statedir.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sum, err := auditlog.VerifyDir(d, nil)
	if err != nil {
		t.Fatalf("the kept audit log: %v", err)
	}
	for _, k := range []string{auditlog.KindTokenMint, auditlog.KindViewerOpen, auditlog.KindViewerClose,
		auditlog.KindHandoverBegin, auditlog.KindHandoverEnd, auditlog.KindPause, auditlog.KindResume} {
		if sum.Kinds[k] == 0 {
			t.Fatalf("the kept audit log has no %s: %v", k, sum.Kinds)
		}
	}
	if sum.Kinds[auditlog.KindTokenMint] != 1 {
		t.Fatalf("%d mints recorded, want alice's one (bob's request minted nothing)", sum.Kinds[auditlog.KindTokenMint])
	}
}
