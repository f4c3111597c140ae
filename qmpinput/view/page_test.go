package view

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/tetherdev/tether/fixtures/browser"
	"github.com/tetherdev/tether/fixtures/guest/screenvm"
	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/token"
)

// Linux key codes of the typed keys.
var keyCodes = map[rune]int{'h': 35, 'e': 18, 'l': 38, 'o': 24, 'i': 23, 'x': 45}

const keyEnter = 28

// wantKeys is the exact evdev key sequence of typing s (down, up each).
func wantKeys(s string) []screenvm.Event {
	var out []screenvm.Event
	for _, r := range s {
		out = append(out, screenvm.Event{Type: 1, Code: keyCodes[r], Value: 1}, screenvm.Event{Type: 1, Code: keyCodes[r], Value: 0})
	}
	return out
}

func keysOnly(evs []screenvm.Event) []screenvm.Event {
	var out []screenvm.Event
	for _, e := range evs {
		if e.Type == 1 {
			out = append(out, e)
		}
	}
	return out
}

// waitKeyUp waits for the release of a key in the guest.
func waitKeyUp(tb testing.TB, ctx context.Context, vm *screenvm.VM, code int) {
	tb.Helper()
	if _, err := vm.Collect(ctx, func(e screenvm.Event) bool { return e == screenvm.Event{Type: 1, Code: code} }); err != nil {
		tb.Fatalf("key %d never reached the guest: %v", code, err)
	}
}

// TestBrowserTakeoverTypesAndHandsBack: the page shows the guest's screen
// and its changes; a control viewer takes over (the agent is fenced and
// masked), types hello (the guest receives exactly those key events),
// hands back (the agent must capture again); the audit log has begin and
// end and no content; the link's fragment is gone and the cookie is
// Secure, HttpOnly and SameSite=Strict.
func TestBrowserTakeoverTypesAndHandsBack(t *testing.T) {
	e := newEnv(t, nil)
	b := browser.New(t, 1280, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tok, secret := e.mint(t, token.RoleControl, time.Hour, "alice")
	b.OpenView(t, e.link(secret))

	t.Run("link and cookie", func(t *testing.T) { checkLinkAndCookie(t, e, b, secret) })
	t.Run("the screen follows the guest", func(t *testing.T) { checkScreenFollows(t, ctx, e, b) })

	b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#takeover")))
	b.Poll(t, "the hold", `tetherView.state.holder_is_you === true`, 30*time.Second)
	t.Run("agent fenced and masked during the hold", func(t *testing.T) {
		if _, err := e.adapter.Capture(ctx); !errors.Is(err, qmpinput.ErrMasked) {
			t.Fatalf("agent capture: %v, want ErrMasked", err)
		}
		if err := e.adapter.Key(ctx, "a"); !errors.Is(err, qmpinput.ErrFenced) {
			t.Fatalf("agent key: %v, want ErrFenced", err)
		}
		if err := e.adapter.Type(ctx, "agent"); !errors.Is(err, qmpinput.ErrFenced) {
			t.Fatalf("agent type: %v, want ErrFenced", err)
		}
	})
	t.Run("typed keys reach the guest exactly", func(t *testing.T) { checkTypedKeys(t, ctx, e, b) })
	screenshot(t, b, "qmpinput-live-view.png")

	b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#handback")))
	b.Poll(t, "the hand back", `tetherView.state.holder === ""`, 30*time.Second)
	t.Run("after hand back the agent captures again", func(t *testing.T) {
		if err := e.adapter.Click(ctx, 10, 10, qmpinput.ButtonLeft); !errors.Is(err, qmpinput.ErrNoCapture) {
			t.Fatalf("agent click right after the hand back: %v, want ErrNoCapture", err)
		}
		if _, err := e.adapter.Capture(ctx); err != nil {
			t.Fatal(err)
		}
		e.agentKeySentinel(t, ctx)
	})
	t.Run("audit has begin and end, no content", func(t *testing.T) { checkHandoverAudit(t, e, tok) })
}

// screenshot saves the page; with TETHER_UPDATE_SCREENSHOTS=1 it also
// replaces the one in docs/images.
func screenshot(tb testing.TB, b *browser.Browser, name string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		tb.Fatal(err)
	}
	os.WriteFile(filepath.Join(tb.TempDir(), name), png, 0o644)
	if os.Getenv("TETHER_UPDATE_SCREENSHOTS") == "1" {
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "images", name), png, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// TestBrowserViewOnlyInputNeverReachesGuest: a view-only viewer whose
// page is made to send keys, clicks and clipboard anyway (as a modified
// client would) reaches nothing: the guest's evdev sees no event before
// the agent's sentinel key, and the proxy dropped the clipboard.
func TestBrowserViewOnlyInputNeverReachesGuest(t *testing.T) {
	e := newEnv(t, nil)
	b := browser.New(t, 1280, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tok, secret := e.mint(t, token.RoleView, time.Hour, "watcher")
	b.OpenView(t, e.link(secret))
	if hidden := browser.Eval[bool](t, b, `["takeover","pause","resume","sendtext"].every(id => document.getElementById(id).hidden)`); !hidden {
		t.Fatal("a view-only page shows control buttons")
	}
	// Undo the page's own view-only switch: only the server's gate is left.
	browser.Eval[bool](t, b, `(tetherView.rfb.viewOnly = false, tetherView.rfb.focus(), true)`)
	mark := e.vm.Mark()
	b.Do(t, 20*time.Second, chromedp.KeyEvent("x"), chromedp.MouseClickXY(300, 200), chromedp.MouseClickXY(500, 300))
	browser.Eval[bool](t, b, `(tetherView.rfb.clipboardPasteFrom("clipboard-secret"), true)`)
	v := e.viewerOf(tok.ID)
	// The clipboard went last: once the proxy has dropped it, the keys
	// and clicks before it were handled too.
	waitFor(t, ctx, "the proxy to see the clipboard", func() bool {
		st := v.stats()
		return st != nil && st.CutTextDropped.Load() >= 1
	})
	e.agentKeySentinel(t, ctx)
	if evs := eventsBefore(e.vm, mark); len(evs) != 0 {
		t.Fatalf("a view-only viewer's input reached the guest: %v", evs)
	}
	if st := v.stats(); st.InputForwarded.Load() != 0 || st.InputDropped.Load() < 4 {
		t.Fatalf("the proxy forwarded %d and dropped %d input events, want 0 and at least 4", st.InputForwarded.Load(), st.InputDropped.Load())
	}
}

// TestBrowserForeignOriginOpensNothing: a page from another origin on
// the same host (same site, so a SameSite cookie would be sent) cannot
// use the session: its WebSocket never opens and its exchange is refused.
func TestBrowserForeignOriginOpensNothing(t *testing.T) {
	e := newEnv(t, nil)
	b := browser.New(t, 1000, 800)
	_, secret := e.mint(t, token.RoleControl, time.Hour, "")
	b.OpenView(t, e.link(secret))
	_, spare := e.mint(t, token.RoleControl, time.Hour, "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	evil := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><script>
window.result = {opened: false, closed: false, status: 0};
const ws = new WebSocket(%q);
ws.onopen = () => { window.result.opened = true; };
ws.onclose = () => { window.result.closed = true; };
fetch(%q, {method: "POST", credentials: "include", headers: {"Content-Type": "application/json"},
  body: JSON.stringify({token: %q})}).then(r => { window.result.status = r.status; }, () => { window.result.status = -1; });
</script>`, "ws"+strings.TrimPrefix(e.origin, "http")+"/ws/control", e.origin+"/api/session", spare)
	})}
	go evil.Serve(l)
	defer evil.Close()
	viewers := len(e.srv.viewerList())
	b.Do(t, 20*time.Second, chromedp.Navigate("http://"+l.Addr().String()+"/"))
	b.Poll(t, "the foreign page's attempts to end", `window.result && window.result.closed && window.result.status !== 0`, 30*time.Second)
	if opened := browser.Eval[bool](t, b, "window.result.opened"); opened {
		t.Fatal("a WebSocket opened from a foreign origin")
	}
	if st := browser.Eval[int](t, b, "window.result.status"); st == http.StatusOK {
		t.Fatal("a foreign origin exchanged a link")
	}
	if n := len(e.srv.viewerList()); n > viewers {
		t.Fatalf("the server added a viewer for a foreign origin (%d -> %d)", viewers, n)
	}
	if st, _ := e.client(e.origin).exchange(spare); st != http.StatusOK {
		t.Fatalf("the refused foreign exchange used up the link: %d", st)
	}
}

var countRe = regexp.MustCompile(`^count (\d+)$`)

// TestBrowserPauseResume: Pause freezes the guest (QEMU reports paused,
// the on-screen counter and its serial lines stop) and fences the agent;
// Resume continues it. Both are audited.
func TestBrowserPauseResume(t *testing.T) {
	e := newEnv(t, nil)
	b := browser.New(t, 1280, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, secret := e.mint(t, token.RoleControl, time.Hour, "carol")
	b.OpenView(t, e.link(secret))
	if err := e.vm.Counter(ctx, true); err != nil {
		t.Fatal(err)
	}
	defer e.vm.Counter(context.Background(), false)
	if _, err := e.vm.WaitFor(ctx, countRe); err != nil {
		t.Fatal(err)
	}
	b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#pause")))
	b.Poll(t, "the paused state", `tetherView.state.paused === true`, 30*time.Second)
	waitFor(t, ctx, "QEMU to report paused", func() bool { st, _ := probeStatus(ctx, e.vm); return st == "paused" })
	if err := e.adapter.Key(ctx, "a"); !errors.Is(err, qmpinput.ErrFenced) {
		t.Fatalf("agent key while paused: %v", err)
	}
	// The counter draws five times a second; frozen, it draws nothing.
	// Wait until the canvas shows the last frame QEMU sent (unchanged for
	// half a second), then watch a window of 1.5 s (7 ticks).
	b.Poll(t, "the last frame", stableExpr(browser.CanvasHash(0, 0, 300, 16), 500), 30*time.Second)
	frozen := canvasHash(t, b, 0, 0, 300, 16)
	linesBefore := len(e.vm.Lines())
	time.Sleep(1500 * time.Millisecond) // an absence can only be watched for a while
	if now := canvasHash(t, b, 0, 0, 300, 16); now != frozen {
		t.Fatal("the on-screen counter moved while paused")
	}
	for _, l := range e.vm.Lines()[linesBefore:] {
		if countRe.MatchString(l) {
			t.Fatalf("the guest printed %q while paused", l)
		}
	}
	b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#resume")))
	b.Poll(t, "the running state", `tetherView.state.paused === false`, 30*time.Second)
	if _, err := e.vm.WaitFor(ctx, countRe); err != nil {
		t.Fatalf("the counter did not continue: %v", err)
	}
	b.Poll(t, "the counter on the canvas", fmt.Sprintf(`(%s) !== %q`, browser.CanvasHash(0, 0, 300, 16), frozen), 30*time.Second)
	if err := e.adapter.Key(ctx, "z"); err != nil {
		t.Fatalf("agent after resume: %v", err)
	}
	var kinds []string
	for _, r := range e.records(t) {
		if !strings.HasPrefix(r.Kind, "viewer_") {
			kinds = append(kinds, r.Kind)
		}
	}
	if fmt.Sprint(kinds) != "[pause resume]" {
		t.Fatalf("audit kinds %v", kinds)
	}
}

// stableExpr is true once expr kept its value for ms milliseconds.
func stableExpr(expr string, ms int) string {
	return fmt.Sprintf(`(() => {
		const v = %s;
		if (window.__stable !== v) { window.__stable = v; window.__since = performance.now(); return false; }
		return performance.now() - window.__since > %d;
	})()`, expr, ms)
}

// TestBrowserPhone: at 390x844 the page fits the width, shows every
// control; text is sent only when the person chooses Send, the Enter key
// button works, and hand back and pause clear unsent text; zoom 200%
// doubles the screen inside a scrolling viewport and Fit brings it back.
func TestBrowserPhone(t *testing.T) {
	e := newEnv(t, nil)
	b := browser.New(t, 390, 844)
	phone(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, secret := e.mint(t, token.RoleControl, time.Hour, "dana")
	b.OpenView(t, e.link(secret))
	b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#takeover")))
	b.Poll(t, "the hold", `tetherView.state.holder_is_you === true && !document.getElementById("sendtext").hidden`, 30*time.Second)
	fits := `(() => {
		const vw = document.documentElement.clientWidth;
		if (vw !== 390 || document.documentElement.scrollWidth > vw) return "page " + document.documentElement.scrollWidth + " wide in " + vw;
		const c = document.querySelector("#screen canvas").getBoundingClientRect();
		if (c.width < 300 || c.right > vw + 0.5) return "canvas " + c.left + ".." + c.right;
		for (const el of document.querySelectorAll("button, input")) {
			if (el.offsetParent === null) continue;
			const r = el.getBoundingClientRect();
			if (r.left < 0 || r.right > vw + 0.5 || r.bottom > window.innerHeight + 0.5 || r.height < 36) return el.id + el.textContent + " at " + r.left + "," + r.top + " " + r.width + "x" + r.height;
		}
		return "";
	})()`
	if msg := browser.Eval[string](t, b, fits); msg != "" {
		t.Fatalf("at 390x844: %s", msg)
	}
	screenshot(t, b, "qmpinput-live-view-phone.png")

	t.Run("text waits for Send", func(t *testing.T) {
		mark := e.vm.Mark()
		b.Do(t, 20*time.Second, chromedp.SendKeys(chromedp.CSS("#text"), "hi"), chromedp.Click(chromedp.CSS(`[data-key="Enter"]`)))
		waitKeyUp(t, ctx, e.vm, keyEnter)
		got := keysOnly(e.vm.EventsSince(mark))
		if want := []screenvm.Event{{Type: 1, Code: keyEnter, Value: 1}, {Type: 1, Code: keyEnter, Value: 0}}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("before Send the guest saw %v, want only the Enter button's key", got)
		}
		mark = e.vm.Mark()
		b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#send")))
		waitKeyUp(t, ctx, e.vm, keyCodes['i'])
		if got := keysOnly(e.vm.EventsSince(mark)); fmt.Sprint(got) != fmt.Sprint(wantKeys("hi")) {
			t.Fatalf("Send typed %v, want %v", got, wantKeys("hi"))
		}
		if v := browser.Eval[string](t, b, `document.getElementById("text").value`); v != "" {
			t.Fatalf("the box still holds %q after Send", v)
		}
	})
	t.Run("hand back and pause clear unsent text", func(t *testing.T) {
		b.Do(t, 20*time.Second, chromedp.SendKeys(chromedp.CSS("#text"), "pending"), chromedp.Click(chromedp.CSS("#handback")))
		b.Poll(t, "the hand back", `tetherView.state.holder === "" && document.getElementById("text").value === ""`, 30*time.Second)
		b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#takeover")))
		b.Poll(t, "the hold", `tetherView.state.holder_is_you && !document.getElementById("sendtext").hidden`, 30*time.Second)
		b.Do(t, 20*time.Second, chromedp.SendKeys(chromedp.CSS("#text"), "pending"), chromedp.Click(chromedp.CSS("#pause")))
		b.Poll(t, "the pause", `tetherView.state.paused && document.getElementById("text").value === "" && document.getElementById("sendtext").hidden`, 30*time.Second)
		b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#resume")))
		b.Poll(t, "the resume", `!tetherView.state.paused`, 30*time.Second)
	})
	t.Run("zoom", func(t *testing.T) {
		b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS(`[data-zoom="2"]`)))
		b.Poll(t, "200% zoom", `Math.abs(document.querySelector("#screen canvas").getBoundingClientRect().width - 2560) < 2 && document.getElementById("viewport").scrollWidth > 390`, 30*time.Second)
		b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS(`[data-zoom="1.5"]`)))
		b.Poll(t, "150% zoom", `Math.abs(document.querySelector("#screen canvas").getBoundingClientRect().width - 1920) < 2`, 30*time.Second)
		b.Do(t, 10*time.Second, chromedp.Click(chromedp.CSS("#fit")))
		b.Poll(t, "fit", `document.querySelector("#screen canvas").getBoundingClientRect().width <= 390 && document.documentElement.scrollWidth <= 390`, 30*time.Second)
	})
}

func checkLinkAndCookie(t *testing.T, e *env, b *browser.Browser, secret string) {
	if href := browser.Eval[string](t, b, "location.href"); strings.Contains(href, "#") || strings.Contains(href, secret[17:]) {
		t.Fatalf("the address bar still holds the link: %s", href)
	}
	if jsCookies := browser.Eval[string](t, b, "document.cookie"); jsCookies != "" {
		t.Fatalf("page script sees cookies %q", jsCookies)
	}
	var found bool
	for _, c := range cookies(t, b, e.origin) {
		if c.Name == CookieName {
			found = true
			if !c.Secure || !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict || c.Path != "/" {
				t.Fatalf("cookie %+v, want Secure, HttpOnly, SameSite=Strict, Path=/", c)
			}
		}
	}
	if !found {
		t.Fatal("no session cookie")
	}
}

func checkScreenFollows(t *testing.T, ctx context.Context, e *env, b *browser.Browser) {
	if w := browser.Eval[int](t, b, `document.querySelector("#screen canvas").width`); w != e.vm.Width {
		t.Fatalf("canvas width %d, want the guest's %d", w, e.vm.Width)
	}
	before := canvasHash(t, b, 0, 32, e.vm.Width, 16)
	if _, err := e.vm.Draw(ctx); err != nil {
		t.Fatal(err)
	}
	b.Poll(t, "the drawn row on the canvas", fmt.Sprintf(`(%s) !== %q`, browser.CanvasHash(0, 32, e.vm.Width, 16), before), 30*time.Second)
}

func checkTypedKeys(t *testing.T, ctx context.Context, e *env, b *browser.Browser) {
	mark := e.vm.Mark()
	screenBefore := canvasHash(t, b, 0, 0, e.vm.Width, e.vm.Height)
	b.Do(t, 20*time.Second, chromedp.KeyEvent("hello"))
	waitKeyUp(t, ctx, e.vm, keyCodes['o'])
	got := keysOnly(e.vm.EventsSince(mark))
	if fmt.Sprint(got) != fmt.Sprint(wantKeys("hello")) {
		t.Fatalf("guest saw keys %v, want %v", got, wantKeys("hello"))
	}
	b.Poll(t, "the echoed text on the canvas", fmt.Sprintf(`(%s) !== %q`, browser.CanvasHash(0, 0, e.vm.Width, e.vm.Height), screenBefore), 30*time.Second)
}

func checkHandoverAudit(t *testing.T, e *env, tok token.Token) {
	var kinds []string
	for _, r := range e.records(t) {
		if strings.HasPrefix(r.Kind, "handover") {
			kinds = append(kinds, r.Kind+":"+r.Reason)
			if r.Actor != tok.Actor() || r.Role != "control" || r.Token != tok.ID {
				t.Fatalf("record %+v does not name alice's control token", r)
			}
		}
	}
	if fmt.Sprint(kinds) != "[handover_begin: handover_end:explicit]" {
		t.Fatalf("handover records %v", kinds)
	}
	raw, _ := os.ReadFile(filepath.Join(e.state, "audit.jsonl"))
	if strings.Contains(string(raw), "hello") {
		t.Fatal("the audit log holds typed text")
	}
}
