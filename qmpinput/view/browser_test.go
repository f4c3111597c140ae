package view

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/tetherdev/tether/fixtures/browser"
)

// The page tests drive Debian's chromium through fixtures/browser; what
// only they need of it is here.

// canvasHash returns a cheap hash of the canvas pixels in a rectangle
// (guest pixels), to see the screen change ("HASH:LIT").
func canvasHash(tb testing.TB, b *browser.Browser, x, y, w, h int) string {
	tb.Helper()
	return browser.Eval[string](tb, b, browser.CanvasHash(x, y, w, h))
}

// cookies returns the browser's cookies for the view.
func cookies(tb testing.TB, b *browser.Browser, origin string) []*network.Cookie {
	tb.Helper()
	var out []*network.Cookie
	b.Do(tb, 10*time.Second, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		r, err := cdpCall(ctx, t, network.GetCookies, network.GetCookiesParams{URLs: []string{origin + "/"}})
		out = r.Cookies
		return err
	}))
	return out
}

// phone emulates a 390x844 touch phone viewport.
func phone(tb testing.TB, b *browser.Browser) {
	tb.Helper()
	b.Do(tb, 10*time.Second, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdpCall(ctx, t, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{
			Width: 390, Height: 844, DeviceScaleFactor: 3, Mobile: true})
		return err
	}))
}

func cdpCall[P, R any](ctx context.Context, t *chromedp.Target, c cdp.Command[P, R], p P) (R, error) {
	return cdp.Call(ctx, t, c, p)
}
