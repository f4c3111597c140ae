// Package backoff is tether's one retry delay and its one context-aware
// sleep: an exponential Backoff with a cap and full jitter, Sleep that
// returns ctx's cause, and Accept, the accept loop's retry of transient
// errors. A leaf, it imports the standard library only.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields growing delays: the n-th (from 0) is drawn uniformly from
// [0, min(Cap, Base<<n)] (full jitter), so many waiters do not retry in
// step; with Equal, from the upper half of that range, so no delay is
// shorter than half its ceiling. The zero value is unusable; set Base and
// Cap. Not safe for concurrent use.
type Backoff struct {
	Base, Cap time.Duration
	Equal     bool
	n         int
	// jitter draws from [0, d]; tests replace it, nil means rand.
	jitter func(d time.Duration) time.Duration
}

// New returns a Backoff from base up to cap, with full jitter.
func New(base, cap time.Duration) *Backoff { return &Backoff{Base: base, Cap: cap} }

// Ceiling is the upper bound of the n-th delay: Base<<n, at most Cap.
func (b *Backoff) Ceiling(n int) time.Duration {
	d := b.Base << min(n, 62)
	if n >= 62 || d <= 0 || d > b.Cap || d>>min(n, 62) != b.Base {
		d = b.Cap
	}
	return d
}

// Delay returns a jittered n-th delay, without changing b.
func (b *Backoff) Delay(n int) time.Duration {
	d := b.Ceiling(n)
	draw := b.jitter
	if draw == nil {
		draw = func(d time.Duration) time.Duration { return rand.N(d + 1) }
	}
	if b.Equal {
		return d - d/2 + draw(d/2)
	}
	return draw(d)
}

// Next returns the next delay and grows the ceiling.
func (b *Backoff) Next() time.Duration {
	d := b.Delay(b.n)
	b.n++
	return d
}

// Reset starts the delays again from Base, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Wait sleeps for Next() or until ctx ends (then ctx's cause).
func (b *Backoff) Wait(ctx context.Context) error { return Sleep(ctx, b.Next()) }

// Sleep waits d or until ctx ends; it returns nil after d, else
// context.Cause(ctx). It does not leak its timer.
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Accept calls accept until it returns a connection (or any value): after
// an error, stop decides — a non-nil error from stop is returned at once
// (the listener closed, the server stopping); nil means the error was
// transient, and warn (if set) hears it and the delay before b's next
// try. b is reset after a success, so one Backoff serves a whole loop.
// The one accept loop of tether's listeners.
func Accept[T any](ctx context.Context, b *Backoff, accept func(context.Context) (T, error),
	stop func(error) error, warn func(err error, delay time.Duration)) (T, error) {
	for {
		v, err := accept(ctx)
		if err == nil {
			b.Reset()
			return v, nil
		}
		if serr := stop(err); serr != nil {
			var zero T
			return zero, serr
		}
		d := b.Next()
		if warn != nil {
			warn(err, d)
		}
		if err := Sleep(ctx, d); err != nil {
			var zero T
			return zero, err
		}
	}
}
