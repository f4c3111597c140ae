package qmpinput

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/tetherdev/tether/admission/backoff"
)

// Button is a pointer button.
type Button = raw.InputButton

// Pointer buttons the adapter sends.
const (
	ButtonLeft   = raw.InputButtonLeft
	ButtonMiddle = raw.InputButtonMiddle
	ButtonRight  = raw.InputButtonRight
)

// Input bounds.
const (
	MaxScroll   = 20  // wheel notches per Scroll
	MaxTypeText = 256 // characters per Type
)

// pixelSpace is the size of the most recent capture.
type pixelSpace struct {
	width, height int
	sha           string
}

// send issues one input-send-event through go-qemu's generated command,
// routed to the pinned display's console.
func (a *Adapter) send(ctx context.Context, events ...raw.InputEvent) error {
	dev, head := a.cfg.Display.Device, int64(a.cfg.Display.Head)
	return raw.NewMonitor(a.conn.bind(ctx)).InputSendEvent(&dev, &head, events)
}

// point checks (x, y) against the most recent capture and returns the
// absolute-axis move events.
func (a *Adapter) point(x, y int) ([]raw.InputEvent, error) {
	s := a.space.Load()
	if s == nil {
		return nil, ErrNoCapture
	}
	if x < 0 || y < 0 || x >= s.width || y >= s.height {
		return nil, &BoundsError{X: x, Y: y, Width: s.width, Height: s.height}
	}
	return []raw.InputEvent{
		raw.InputEventAbs{Axis: raw.InputAxisX, Value: int64(PixelToAbs(x, s.width))},
		raw.InputEventAbs{Axis: raw.InputAxisY, Value: int64(PixelToAbs(y, s.height))},
	}, nil
}

// Move moves the pointer to pixel (x, y) of the most recent capture.
func (a *Adapter) Move(ctx context.Context, x, y int) error {
	return a.input(ctx, func() error {
		ev, err := a.point(x, y)
		if err != nil {
			return err
		}
		return a.send(ctx, ev...)
	})
}

// Click moves to (x, y) and presses then releases b, as two separate
// input-send-event commands.
func (a *Adapter) Click(ctx context.Context, x, y int, b Button) error {
	return a.input(ctx, func() error { return a.click(ctx, x, y, b) })
}

// DoubleClick clicks the left button twice at (x, y).
func (a *Adapter) DoubleClick(ctx context.Context, x, y int) error {
	return a.input(ctx, func() error {
		if err := a.click(ctx, x, y, ButtonLeft); err != nil {
			return err
		}
		if err := backoff.Sleep(ctx, a.cfg.DoubleClickGap); err != nil {
			return err
		}
		if err := a.gate(); err != nil {
			return err
		}
		return a.click(ctx, x, y, ButtonLeft)
	})
}

func (a *Adapter) click(ctx context.Context, x, y int, b Button) error {
	if b != ButtonLeft && b != ButtonMiddle && b != ButtonRight {
		return fmt.Errorf("%w: button %v", ErrKeyNotAllowed, b)
	}
	ev, err := a.point(x, y)
	if err != nil {
		return err
	}
	if err := a.send(ctx, append(ev, raw.InputEventBtn{Button: b, Down: true})...); err != nil {
		return err
	}
	return a.release(ctx, raw.InputEventBtn{Button: b, Down: false})
}

// release sends up events even if ctx has ended, so no button or key is
// left held; it gets its own short deadline.
func (a *Adapter) release(ctx context.Context, events ...raw.InputEvent) error {
	if err := backoff.Sleep(ctx, a.cfg.PressHold); err != nil {
		ctx = context.WithoutCancel(ctx)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	return a.send(rctx, events...)
}

// Scroll turns the wheel dy notches at the pointer: negative scrolls up.
// Like pointer input it needs a capture: the pointer stands somewhere in
// the most recent capture's pixel space, so without one (none yet, or
// dropped by a handover) it fails with ErrNoCapture.
func (a *Adapter) Scroll(ctx context.Context, dy int) error {
	if dy == 0 || dy < -MaxScroll || dy > MaxScroll {
		return fmt.Errorf("%w: %d notches (1..%d either way)", ErrScrollNotAllowed, dy, MaxScroll)
	}
	b, n := raw.InputButtonWheelDown, dy
	if dy < 0 {
		b, n = raw.InputButtonWheelUp, -dy
	}
	return a.input(ctx, func() error {
		if a.space.Load() == nil {
			return ErrNoCapture
		}
		for range n {
			if err := a.gate(); err != nil {
				return err
			}
			if err := a.send(ctx, raw.InputEventBtn{Button: b, Down: true}); err != nil {
				return err
			}
			if err := a.release(ctx, raw.InputEventBtn{Button: b, Down: false}); err != nil {
				return err
			}
		}
		return nil
	})
}

// Key presses a combo such as "ctrl+alt+t": every key is from the QKeyCode
// allowlist; keys go down in order and up in reverse order, as two commands.
func (a *Adapter) Key(ctx context.Context, combo string) error {
	codes, err := parseCombo(combo)
	if err != nil {
		return err
	}
	return a.input(ctx, func() error { return a.press(ctx, codes) })
}

func (a *Adapter) press(ctx context.Context, codes []raw.QKeyCode) error {
	down := make([]raw.InputEvent, 0, len(codes))
	up := make([]raw.InputEvent, 0, len(codes))
	for i, k := range codes {
		down = append(down, raw.InputEventKey{Key: raw.KeyValueQcode(k), Down: true})
		up = append(up, raw.InputEventKey{Key: raw.KeyValueQcode(codes[len(codes)-1-i]), Down: false})
	}
	if err := a.send(ctx, down...); err != nil {
		return err
	}
	return a.release(ctx, up...)
}

// Type types text of at most MaxTypeText characters from the US layout
// (printable ASCII, tab, newline), at most Config.TypeRate characters per
// second. The whole text is checked before the first key goes down; a
// handover that begins while typing stops it with ErrFenced.
func (a *Adapter) Type(ctx context.Context, text string) error {
	keys, err := layout(text)
	if err != nil {
		return err
	}
	return a.input(ctx, func() error {
		for _, k := range keys {
			if err := a.typeLimit.Wait(ctx); err != nil {
				return fmt.Errorf("typing rate limit: %w", err)
			}
			if err := a.gate(); err != nil {
				return err
			}
			codes := []raw.QKeyCode{k.code}
			if k.shift {
				codes = []raw.QKeyCode{raw.QKeyCodeShift, k.code}
			}
			if err := a.press(ctx, codes); err != nil {
				return err
			}
		}
		return nil
	})
}

func layout(text string) ([]typedKey, error) {
	if n := utf8.RuneCountInString(text); n == 0 || n > MaxTypeText {
		return nil, fmt.Errorf("%w: %d characters (1..%d)", ErrTextNotAllowed, n, MaxTypeText)
	}
	keys := make([]typedKey, 0, len(text))
	for i, r := range text {
		k, ok := usLayout[r]
		if !ok {
			return nil, fmt.Errorf("%w: character %q at byte %d has no key on the US layout", ErrTextNotAllowed, r, i)
		}
		keys = append(keys, k)
	}
	return keys, nil
}
