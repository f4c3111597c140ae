package view

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// browser is one headless chromium (Debian's) driven through chromedp.
type browser struct {
	ctx context.Context
}

// newBrowser starts chromium with a fresh profile and a w x h window. The
// browser lives until the test ends.
func newBrowser(tb testing.TB, w, h int) *browser {
	tb.Helper()
	testenv.Require(tb, "browser")
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath("chromium"), chromedp.UserDataDir(tb.TempDir()),
		chromedp.WindowSize(w, h)}
	for _, f := range testenv.ChromiumFlags {
		opts = append(opts, chromedp.Flag(strings.TrimPrefix(f, "--"), true))
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	tb.Cleanup(func() { cancel(); cancelA() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		tb.Fatalf("chromium: %v", err)
	}
	return &browser{ctx: ctx}
}

// do runs actions with a bound.
func (b *browser) do(tb testing.TB, d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.Fatal(err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](tb testing.TB, b *browser, expr string) T {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		tb.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// poll waits until a JavaScript predicate is truthy.
func (b *browser) poll(tb testing.TB, what, expr string, d time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(d))); err != nil {
		tb.Fatalf("waiting for %s (%s): %v", what, expr, err)
	}
}

// open navigates to a link and waits until the screen is connected.
func (b *browser) open(tb testing.TB, link string) {
	tb.Helper()
	b.do(tb, 30*time.Second, chromedp.Navigate(link))
	b.poll(tb, "the screen", `window.tetherView && tetherView.rfb && tetherView.state && document.querySelector("#screen canvas") && document.querySelector("#screen canvas").width > 0`, 60*time.Second)
}

// canvasHash returns a cheap hash of the canvas pixels in a rectangle
// (guest pixels), to see the screen change.
func canvasHash(tb testing.TB, b *browser, x, y, w, h int) string {
	return eval[string](tb, b, fmt.Sprintf(`(() => {
		const c = document.querySelector("#screen canvas");
		const d = c.getContext("2d").getImageData(%d, %d, %d, %d).data;
		let h1 = 2166136261, lit = 0;
		for (let i = 0; i < d.length; i += 4) {
			h1 = Math.imul(h1 ^ (d[i] | d[i+1] << 8 | d[i+2] << 16), 16777619);
			if (d[i] | d[i+1] | d[i+2]) lit++;
		}
		return (h1 >>> 0).toString(16) + ":" + lit;
	})()`, x, y, w, h))
}

// cookies returns the browser's cookies for the view.
func (b *browser) cookies(tb testing.TB, origin string) []*network.Cookie {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	var out []*network.Cookie
	err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		r, err := cdpCall(ctx, t, network.GetCookies, network.GetCookiesParams{URLs: []string{origin + "/"}})
		out = r.Cookies
		return err
	}))
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// phone emulates a 390x844 touch phone viewport.
func (b *browser) phone(tb testing.TB) {
	tb.Helper()
	b.do(tb, 10*time.Second, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdpCall(ctx, t, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{
			Width: 390, Height: 844, DeviceScaleFactor: 3, Mobile: true})
		return err
	}))
}

func cdpCall[P, R any](ctx context.Context, t *chromedp.Target, c cdp.Command[P, R], p P) (R, error) {
	return cdp.Call(ctx, t, c, p)
}
