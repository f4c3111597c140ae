package custodian

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherdev/tether/admission/backoff"
	"github.com/tetherdev/tether/custodian/opstore"
)

// The backoff between two tries of a bind step the op store answered
// unavailable: the first wait, doubled after each try up to the cap, and
// never past the bound (Options.StoreWait).
const (
	storeRetryFirst = 100 * time.Millisecond
	storeRetryCap   = 2 * time.Second
	// storeTryMax bounds one try: etcd without quorum does not answer a
	// linearizable read or a write at all, it holds the request, so an
	// unbounded try would wait the whole bound without a word.
	storeTryMax = 5 * time.Second
)

// waitStore runs step, and again while it fails because the op store
// answered unavailable (opstore.ErrUnavailable: etcd did not answer, or
// answered that it could not, so the step's outcome is unknown), for at
// most bound in total. what names the step in the log and in the error.
// Only steps that are safe to repeat whatever their earlier try left
// behind are passed here: the caller says why in a comment.
//
// step gets a context that ends after storeTryMax, or at the bound if
// that comes first, so a try that hangs on a cluster without quorum ends
// and is tried again (and logged). When ctx ends (SIGINT, SIGTERM, a
// lost ownership lease) the wait ends at once with the last error. A
// zero bound runs step once.
func (c *Custodian) waitStore(ctx context.Context, bound time.Duration, what string, step func(context.Context) error) error {
	if bound <= 0 {
		return step(ctx)
	}
	start := time.Now()
	wctx, cancel := context.WithDeadline(ctx, start.Add(bound))
	defer cancel()
	pauses := backoff.Backoff{Base: storeRetryFirst, Cap: storeRetryCap}
	var cause error // the last answer that was not the bound cutting a try short
	for try := 1; ; try++ {
		tctx, endTry := context.WithTimeout(wctx, storeTryMax)
		err := step(tctx)
		cut := tctx.Err() != nil
		endTry()
		if err == nil || !errors.Is(err, opstore.ErrUnavailable) {
			return err
		}
		if cut && wctx.Err() == nil {
			err = fmt.Errorf("no answer within %s: %w", storeTryMax, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: interrupted while the op store was unavailable (%w): %w", what, context.Cause(ctx), err)
		}
		if wctx.Err() == nil || cause == nil {
			cause = err
		}
		waited := time.Since(start)
		pause := min(pauses.Ceiling(try-1), bound-waited)
		if pause <= 0 || wctx.Err() != nil {
			return fmt.Errorf("%s: the op store answered unavailable for %s, giving up at the bound (op_store unavailable_wait_s, %s): %w",
				what, waited.Round(time.Millisecond), bound, cause)
		}
		c.log.Warn("op store unavailable, retrying", "step", what, "try", try, "waited", waited.Round(time.Millisecond),
			"next_in", pause, "bound", bound, "err", err)
		if backoff.Sleep(wctx, pause) != nil && ctx.Err() != nil {
			return fmt.Errorf("%s: interrupted while the op store was unavailable (%w): %w", what, context.Cause(ctx), err)
		}
	}
}

// keepForLease records a tuple's lease end in the operation-key store
// before a binding takes it, so keys dispatched under an earlier lease
// are kept as long as the extended one (ErrRetention when it cannot).
func (c *Custodian) keepForLease(ctx context.Context, tupleSHA256 string, notAfter time.Time) error {
	if err := c.store.KeepForLease(ctx, tupleSHA256, notAfter); err != nil {
		return fmt.Errorf("%w: %w", ErrRetention, err)
	}
	return nil
}

// keepForLeaseWaiting is keepForLease (binding.Hooks.KeepForLease), with
// wait waiting out an unavailable op store for up to Options.StoreWait:
// the record only ever lengthens the recorded lease (a compare-and-swap),
// so it is safe to repeat.
func (c *Custodian) keepForLeaseWaiting(ctx context.Context, digest string, notAfter time.Time, wait bool) error {
	if !wait {
		return c.keepForLease(ctx, digest, notAfter)
	}
	return c.waitStore(ctx, c.opts.StoreWait, "record the lease of tuple "+digest, func(ctx context.Context) error {
		return c.keepForLease(ctx, digest, notAfter)
	})
}
