package vm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// screenBrowser is one headless chromium (Debian's) driven through
// chromedp, as qmpinput/view's page tests drive it.
type screenBrowser struct{ ctx context.Context }

// newScreenBrowser starts chromium with a fresh profile; it lives until
// the test ends.
func newScreenBrowser(tb testing.TB) *screenBrowser {
	tb.Helper()
	testenv.Require(tb, "browser")
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath("chromium"), chromedp.UserDataDir(tb.TempDir()),
		chromedp.WindowSize(ScreenWidth, ScreenHeight+200)}
	for _, f := range testenv.ChromiumFlags {
		opts = append(opts, chromedp.Flag(strings.TrimPrefix(f, "--"), true))
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	tb.Cleanup(func() { cancel(); cancelA() })
	if err := chromedp.Do(ctx); err != nil {
		tb.Fatalf("chromium: %v", err)
	}
	return &screenBrowser{ctx: ctx}
}

// do runs actions with a bound.
func (b *screenBrowser) do(tb testing.TB, d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.Fatal(err)
	}
}

// eval evaluates a JavaScript expression whose value is a string.
func (b *screenBrowser) eval(tb testing.TB, expr string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		tb.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// poll waits until a JavaScript predicate is truthy.
func (b *screenBrowser) poll(tb testing.TB, what, expr string, d time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(d))); err != nil {
		tb.Fatalf("waiting for %s (%s): %v", what, expr, err)
	}
}

// open navigates to a link and waits until the screen is connected.
func (b *screenBrowser) open(tb testing.TB, link string) {
	tb.Helper()
	b.do(tb, 30*time.Second, chromedp.Navigate(link))
	b.poll(tb, "the screen", `window.tetherView && tetherView.rfb && tetherView.state && document.querySelector("#screen canvas") && document.querySelector("#screen canvas").width > 0`, 60*time.Second)
}

// hashOf is a JavaScript expression: a cheap hash of the canvas pixels
// in a rectangle (guest pixels) and the count of lit ones, "HASH:LIT".
func hashOf(x, y, w, h int) string {
	return fmt.Sprintf(`(() => {
		const c = document.querySelector("#screen canvas");
		const d = c.getContext("2d").getImageData(%d, %d, %d, %d).data;
		let h1 = 2166136261, lit = 0;
		for (let i = 0; i < d.length; i += 4) {
			h1 = Math.imul(h1 ^ (d[i] | d[i+1] << 8 | d[i+2] << 16), 16777619);
			if (d[i] | d[i+1] | d[i+2]) lit++;
		}
		return (h1 >>> 0).toString(16) + ":" + lit;
	})()`, x, y, w, h)
}

// litOver is a JavaScript predicate: more than n pixels of the rectangle
// are lit.
func litOver(x, y, w, h, n int) string {
	return fmt.Sprintf(`Number((%s).split(":")[1]) > %d`, hashOf(x, y, w, h), n)
}

// litCount is the LIT of a hashOf value.
func litCount(v string) int {
	var n int
	_, lit, _ := strings.Cut(v, ":")
	fmt.Sscan(lit, &n)
	return n
}
