package rfb

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/guest/screenvm"
	"github.com/tetherdev/tether/qmpinput"
)

// Linux key codes and X keysyms the tests type.
const (
	keyA, keyB, keyC, keyD = 30, 48, 46, 32
	xkA, xkB, xkC, xkD     = 0x61, 0x62, 0x63, 0x64
)

func keyTap(keysym uint32) []Msg {
	return []Msg{KeyEvent{Down: true, Keysym: keysym}, KeyEvent{Keysym: keysym}}
}

// waitKeyUp collects guest events until the key's release and returns
// everything seen since mark.
func waitKeyUp(t *testing.T, ctx context.Context, vm *screenvm.VM, code int) []screenvm.Event {
	t.Helper()
	if _, err := vm.Collect(ctx, func(e screenvm.Event) bool { return e == screenvm.Event{Type: screenvm.EvKey, Code: code} }); err != nil {
		t.Fatalf("key %d never reached the guest: %v", code, err)
	}
	return nil
}

func keysIn(evs []screenvm.Event) []screenvm.Event {
	var out []screenvm.Event
	for _, e := range evs {
		if e.Type == screenvm.EvKey {
			out = append(out, e)
		}
	}
	return out
}

// TestIntegrationProxyGatesInput: through a real QEMU VNC server, input
// from a viewer without control never reaches the guest's evdev, input
// with control arrives exactly, a pointer event lands on QEMU's abs
// scale, and Release lifts what the viewer held down.
func TestIntegrationProxyGatesInput(t *testing.T) {
	vm := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gate := &switchGate{}
	p := startProxy(t, vm, gate)

	mark := vm.Mark()
	if err := p.client.send(append(keyTap(xkA), PointerEvent{Mask: 1, X: 100, Y: 100}, PointerEvent{X: 100, Y: 100})...); err != nil {
		t.Fatal(err)
	}
	waitCount(t, ctx, &p.sess.Stats().InputDropped, 4)
	gate.open.Store(true)
	if err := p.client.send(keyTap(xkB)...); err != nil {
		t.Fatal(err)
	}
	waitKeyUp(t, ctx, vm, keyB)
	got := vm.EventsSince(mark)
	want := []screenvm.Event{{Type: 1, Code: keyB, Value: 1}, {Type: 1, Code: keyB, Value: 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("guest saw %v; want only the key typed with control %v (a, the click and the move were sent without it)", got, want)
	}
	if p.sess.Stats().InputDropped.Load() != 4 || p.sess.Stats().InputForwarded.Load() != 2 {
		t.Fatalf("dropped %d forwarded %d, want 4 and 2", p.sess.Stats().InputDropped.Load(), p.sess.Stats().InputForwarded.Load())
	}

	t.Run("pointer lands on QEMU's scale", func(t *testing.T) {
		// evdev reports an axis only when it changes, and the VM is shared
		// (an earlier test, or an earlier run under -count, may have left
		// the pointer on the target): click elsewhere first, so the click
		// on the target always moves both axes.
		x, y := uint16(1000), uint16(700)
		click := func(x, y uint16) ([]screenvm.Event, error) {
			if err := p.client.send(PointerEvent{Mask: 1, X: x, Y: y}, PointerEvent{X: x, Y: y}); err != nil {
				return nil, err
			}
			return vm.Collect(ctx, func(e screenvm.Event) bool { return e == screenvm.Event{Type: 1, Code: screenvm.BtnLeft} })
		}
		if _, err := click(x/2, y/2); err != nil {
			t.Fatal(err)
		}
		evs, err := click(x, y)
		if err != nil {
			t.Fatal(err)
		}
		ax, ay := -1, -1
		for _, e := range evs {
			if e.Type == screenvm.EvAbs && e.Code == 0 {
				ax = e.Value
			}
			if e.Type == screenvm.EvAbs && e.Code == 1 {
				ay = e.Value
			}
		}
		if ax != qmpinput.PixelToAbs(int(x), vm.Width) || ay != qmpinput.PixelToAbs(int(y), vm.Height) {
			t.Fatalf("guest abs (%d,%d), want (%d,%d); events %v", ax, ay, qmpinput.PixelToAbs(int(x), vm.Width), qmpinput.PixelToAbs(int(y), vm.Height), evs)
		}
	})

	t.Run("release lifts held keys", func(t *testing.T) {
		if err := p.client.send(KeyEvent{Down: true, Keysym: xkC}); err != nil {
			t.Fatal(err)
		}
		if _, err := vm.Collect(ctx, func(e screenvm.Event) bool { return e == screenvm.Event{Type: 1, Code: keyC, Value: 1} }); err != nil {
			t.Fatal(err)
		}
		gate.mu.Lock()
		gate.open.Store(false)
		err := p.sess.Release()
		gate.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		waitKeyUp(t, ctx, vm, keyC)
	})
}

// TestIntegrationMalformedClosesOnlyThatViewer: a malformed message ends
// its own session with a *MalformedError; a second viewer on the same
// QEMU keeps working.
func TestIntegrationMalformedClosesOnlyThatViewer(t *testing.T) {
	vm := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gate := &switchGate{}
	gate.open.Store(true)
	bad, good := startProxy(t, vm, gate), startProxy(t, vm, gate)
	if _, err := bad.client.c.Write([]byte{7, 0, 0, 0}); err != nil { // type 7 does not exist
		t.Fatal(err)
	}
	select {
	case err := <-bad.done:
		bad.done <- err // for the cleanup
		var me *MalformedError
		if !errors.As(err, &me) || me.Type != 7 {
			t.Fatalf("session ended with %v, want a MalformedError for type 7", err)
		}
	case <-ctx.Done():
		t.Fatal("a malformed message did not end the session")
	}
	if _, err := bad.client.c.Write(KeyEvent{Down: true, Keysym: xkA}.Encode()); err == nil {
		t.Fatal("the malformed viewer's connection is still open")
	}
	if err := good.client.send(keyTap(xkD)...); err != nil {
		t.Fatal(err)
	}
	waitKeyUp(t, ctx, vm, keyD)
	if _, _, err := good.client.update(false, time.Now().Add(30*time.Second)); err != nil {
		t.Fatalf("the other viewer's screen stopped: %v", err)
	}
}

// TestIntegrationUpdatesReachViewer: a change the guest draws arrives as
// a framebuffer update after the viewer asked for one; the session counts
// the bytes it carried to the viewer.
func TestIntegrationUpdatesReachViewer(t *testing.T) {
	vm := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, vm, &switchGate{})
	if _, _, err := p.client.update(false, time.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	before := p.sess.Stats().ToViewer.Load()
	if _, err := vm.Draw(ctx); err != nil {
		t.Fatal(err)
	}
	rects, n, err := p.client.update(true, time.Now().Add(30*time.Second))
	if err != nil || len(rects) == 0 {
		t.Fatalf("no update after the guest drew: %v", err)
	}
	// The drawn line is row 3 of the 8x16 font: pixels 32..47.
	hit := false
	for _, r := range rects {
		hit = hit || (r[1] <= 40 && r[1]+r[3] > 40)
	}
	if !hit {
		t.Fatalf("update rects %v miss the drawn row", rects)
	}
	// The session counts a write once it returned, just after the viewer read it.
	waitCount(t, ctx, &p.sess.Stats().ToViewer, before+int64(n))
}
