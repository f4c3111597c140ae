package backoff

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

func TestCeilingDoublesToTheCapAndResets(t *testing.T) {
	b := New(5*time.Millisecond, 40*time.Millisecond)
	b.jitter = func(d time.Duration) time.Duration { return d }
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	ms := time.Millisecond
	if want := []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 40 * ms, 40 * ms}; !slices.Equal(got, want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
	b.Reset()
	if d := b.Next(); d != 5*ms {
		t.Fatalf("after Reset: %v, want 5ms", d)
	}
}

func TestEqualJitterKeepsTheUpperHalf(t *testing.T) {
	b := &Backoff{Base: 10 * time.Millisecond, Cap: 200 * time.Millisecond, Equal: true}
	for n := range 100 {
		c := b.Ceiling(n)
		if d := b.Delay(n); d < c-c/2 || d > c {
			t.Fatalf("delay %d: %v outside [%v, %v]", n, d, c-c/2, c)
		}
	}
	b.jitter = func(time.Duration) time.Duration { return 0 }
	if d := b.Delay(0); d != 5*time.Millisecond {
		t.Fatalf("lowest first delay %v, want 5ms", d)
	}
}

func TestCeilingDoesNotOverflow(t *testing.T) {
	b := New(time.Second, time.Hour)
	for range 200 {
		if d := b.Next(); d < 0 || d > time.Hour {
			t.Fatalf("delay %v outside [0, 1h]", d)
		}
	}
}

// TestJitterSpreadsDelays: full jitter draws from [0, ceiling], so 100
// draws are not all the same and none passes the ceiling.
func TestJitterSpreadsDelays(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		b := New(time.Second, time.Second)
		d := b.Next()
		if d < 0 || d > time.Second {
			t.Fatalf("delay %v outside [0, 1s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 2 {
		t.Fatalf("100 draws gave %d distinct delays", len(seen))
	}
}

func TestSleepReturnsTheCause(t *testing.T) {
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	start := time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, cause) {
		t.Fatalf("Sleep on an ended context: %v, want the cause", err)
	}
	if time.Since(start) > time.Minute {
		t.Fatal("Sleep waited on an ended context")
	}
}

func TestAcceptRetriesTransientErrorsAndStops(t *testing.T) {
	b := New(time.Microsecond, time.Microsecond)
	errTemp, errClosed := errors.New("EMFILE"), errors.New("closed")
	results := []error{errTemp, errTemp, nil, errClosed}
	var warned int
	accept := func(context.Context) (int, error) {
		err := results[0]
		results = results[1:]
		return len(results), err
	}
	stop := func(err error) error {
		if err == errClosed {
			return err
		}
		return nil
	}
	warn := func(error, time.Duration) { warned++ }
	v, err := Accept(context.Background(), b, accept, stop, warn)
	if err != nil || v != 1 || warned != 2 || b.n != 0 {
		t.Fatalf("Accept = %d, %v after %d warnings (backoff n=%d); want 1, nil, 2, 0", v, err, warned, b.n)
	}
	if _, err := Accept(context.Background(), b, accept, stop, warn); err != errClosed {
		t.Fatalf("Accept after close: %v, want %v", err, errClosed)
	}
}

func TestAcceptEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	accept := func(context.Context) (int, error) { cancel(); return 0, errors.New("EMFILE") }
	_, err := Accept(ctx, New(time.Hour, time.Hour), accept, func(error) error { return nil }, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Accept: %v, want context.Canceled", err)
	}
}
