package custodian

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian/opstore"
)

// logLines is a slog handler's output, safe to read while written.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func waitingCustodian() (*Custodian, *logLines) {
	var l logLines
	return &Custodian{log: slog.New(slog.NewTextHandler(&l, nil))}, &l
}

// TestWaitStoreRetriesOnlyUnavailable: an unavailable answer is tried
// again (each retry logged once, with the cause) until the step succeeds;
// any other error is returned at once, never repeated.
func TestWaitStoreRetriesOnlyUnavailable(t *testing.T) {
	c, log := waitingCustodian()
	tries := 0
	err := c.waitStore(context.Background(), time.Minute, "step-a", func(context.Context) error {
		if tries++; tries < 3 {
			return fmt.Errorf("%w: member restarting", opstore.ErrUnavailable)
		}
		return nil
	})
	if err != nil || tries != 3 || log.count("op store unavailable, retrying") != 2 || log.count("member restarting") != 2 {
		t.Fatalf("err %v after %d tries, log:\n%s", err, tries, log.b.String())
	}
	for _, other := range []error{opstore.ErrFenced, opstore.ErrInvalid, &opstore.OwnedError{SessionID: "s"}} {
		tries = 0
		err := c.waitStore(context.Background(), time.Minute, "step-b", func(context.Context) error { tries++; return other })
		if !errors.Is(err, other) || tries != 1 {
			t.Errorf("%v: err %v after %d tries, want it once", other, err, tries)
		}
	}
}

// TestWaitStoreBound: a step that keeps answering unavailable is given up
// at the bound (not before, not long after), naming the step, the bound
// and the cause; a zero bound runs the step once.
func TestWaitStoreBound(t *testing.T) {
	c, _ := waitingCustodian()
	const bound = 700 * time.Millisecond
	start := time.Now()
	tries := 0
	err := c.waitStore(context.Background(), bound, "record X", func(context.Context) error {
		tries++
		return fmt.Errorf("%w: no leader", opstore.ErrUnavailable)
	})
	took := time.Since(start)
	if !errors.Is(err, opstore.ErrUnavailable) || took < bound || took > bound+500*time.Millisecond || tries < 3 {
		t.Fatalf("err %v after %s and %d tries, bound %s", err, took, tries, bound)
	}
	for _, want := range []string{"record X", "giving up at the bound", "700ms", "no leader"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	tries = 0
	err = c.waitStore(context.Background(), 0, "once", func(context.Context) error { tries++; return opstore.ErrUnavailable })
	if !errors.Is(err, opstore.ErrUnavailable) || tries != 1 {
		t.Fatalf("zero bound: err %v after %d tries", err, tries)
	}
}

// TestWaitStoreCtxEndsWait: when the caller's context ends (SIGINT,
// SIGTERM), the wait ends at once, whether in a try or between tries.
func TestWaitStoreCtxEndsWait(t *testing.T) {
	c, log := waitingCustodian()
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("interrupt")
	go func() {
		for log.count("op store unavailable, retrying") < 2 {
			time.Sleep(time.Millisecond)
		}
		cancel(stop)
	}()
	start := time.Now()
	err := c.waitStore(ctx, time.Hour, "step-c", func(ctx context.Context) error {
		<-time.After(10 * time.Millisecond)
		return fmt.Errorf("%w: no answer", opstore.ErrUnavailable)
	})
	if !errors.Is(err, stop) || !errors.Is(err, opstore.ErrUnavailable) || time.Since(start) > 10*time.Second {
		t.Fatalf("err %v after %s, want the interrupt at once", err, time.Since(start))
	}
	// Cancelled in the middle of a try that waits for its context.
	ctx, cancel = context.WithCancelCause(context.Background())
	time.AfterFunc(50*time.Millisecond, func() { cancel(stop) })
	start = time.Now()
	err = c.waitStore(ctx, time.Hour, "step-d", func(ctx context.Context) error {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", opstore.ErrUnavailable, ctx.Err())
	})
	if !errors.Is(err, stop) || time.Since(start) > 2*time.Second {
		t.Fatalf("err %v after %s, want the interrupt at once", err, time.Since(start))
	}
}
