package custodian

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/backoff"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// ReceiverConn is one connection to a receiver. *wireclient.Client implements
// it: CallFenced never re-sends, carries the session's fencing token (0:
// none, the single-machine op store), a call in flight when the
// connection breaks fails with an error carrying errcode.CodeFateUnknown,
// and Done closes when the connection has ended.
type ReceiverConn interface {
	CallFenced(ctx context.Context, op wire.Op, tupleSHA256, opKey string, fence uint64, deadline time.Time, args, result any) error
	Done() <-chan struct{}
	Close() error
}

var _ ReceiverConn = (*wireclient.Client)(nil)

// Dialer opens one new receiver connection; the caller owns and closes it.
type Dialer func(ctx context.Context) (ReceiverConn, error)

// StreamDialer adapts a transport's Dial (receiver/transport.Transport)
// into a Dialer that speaks the wire protocol over each new stream.
func StreamDialer(dial func(ctx context.Context) (io.ReadWriteCloser, error), cfg wireclient.ClientConfig) Dialer {
	return func(ctx context.Context) (ReceiverConn, error) {
		rwc, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		c, err := wireclient.NewClient(rwc, cfg)
		if err != nil {
			rwc.Close()
			return nil, err
		}
		return c, nil
	}
}

// Backoff bounds the delay between reconnection attempts.
type Backoff struct {
	Min, Max time.Duration
}

// delay is admission/backoff's delay from Min to Max, jittered in the
// upper half: [d/2, d].
func (b Backoff) delay(attempt int) time.Duration {
	return (&backoff.Backoff{Base: b.Min, Cap: b.Max, Equal: true}).Delay(attempt)
}

// Receiver keeps one connection to one receiver. When the connection ends
// it tells its watchers (so bindings are fenced) and redials with bounded
// backoff, forever, until Close. Every connection has an epoch; a binding
// attached on epoch e may only dispatch on epoch e, so after a loss nothing
// is sent for it until `_tether/attach` succeeds on the new connection.
type Receiver struct {
	dial    Dialer
	backoff Backoff
	log     *slog.Logger

	mu       sync.Mutex
	conn     ReceiverConn
	epoch    uint64
	up       chan struct{} // closed while conn is up; replaced when it goes down
	watchers map[int]func(epoch uint64, cause error)
	nextW    int

	stop context.CancelFunc
	done chan struct{}
}

// NewReceiver starts maintaining a connection made by dial. Close must be
// called; it closes the connection and joins the maintainer goroutine.
func NewReceiver(dial Dialer, backoff Backoff, log *slog.Logger) *Receiver {
	if backoff.Min <= 0 {
		backoff.Min = 50 * time.Millisecond
	}
	if backoff.Max < backoff.Min {
		backoff.Max = 5 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &Receiver{dial: dial, backoff: backoff, log: log, up: make(chan struct{}),
		watchers: map[int]func(uint64, error){}, stop: stop, done: make(chan struct{})}
	go r.maintain(ctx)
	return r
}

// maintain dials, waits for the connection to end, reports the loss and
// dials again.
func (r *Receiver) maintain(ctx context.Context) {
	defer close(r.done)
	for attempt := 0; ; {
		c, err := r.dial(ctx)
		if ctx.Err() != nil {
			if c != nil {
				c.Close()
			}
			return
		}
		if err != nil {
			r.log.Warn("receiver dial failed", "attempt", attempt, "err", err)
			if backoff.Sleep(ctx, r.backoff.delay(attempt)) != nil {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		epoch := r.setUp(c)
		select {
		case <-c.Done():
		case <-ctx.Done():
		}
		c.Close()
		r.setDown(epoch, errors.New("receiver connection lost"))
		if ctx.Err() != nil {
			return
		}
		if backoff.Sleep(ctx, r.backoff.delay(0)) != nil {
			return
		}
	}
}

func (r *Receiver) setUp(c ReceiverConn) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epoch++
	r.conn = c
	close(r.up)
	return r.epoch
}

func (r *Receiver) setDown(epoch uint64, cause error) {
	r.mu.Lock()
	r.conn = nil
	r.up = make(chan struct{})
	ws := make([]func(uint64, error), 0, len(r.watchers))
	for _, w := range r.watchers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	for _, w := range ws {
		w(epoch, cause)
	}
}

// Watch registers fn to be called (on the maintainer goroutine) whenever
// the connection of some epoch is lost. The returned func unregisters it.
func (r *Receiver) Watch(fn func(epoch uint64, cause error)) (cancel func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.nextW
	r.nextW++
	r.watchers[id] = fn
	return func() {
		r.mu.Lock()
		delete(r.watchers, id)
		r.mu.Unlock()
	}
}

// current returns the live connection and its epoch, waiting for one until
// ctx ends when wait is set.
func (r *Receiver) current(ctx context.Context, wait bool) (ReceiverConn, uint64, error) {
	for {
		r.mu.Lock()
		c, epoch, up := r.conn, r.epoch, r.up
		r.mu.Unlock()
		if c != nil {
			return c, epoch, nil
		}
		if !wait {
			return nil, 0, errcode.Errorf(errcode.CodeUnavailable, "receiver not connected")
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, 0, errcode.Errorf(errcode.CodeUnavailable, "receiver not connected: %v", ctx.Err())
		case <-r.done:
			return nil, 0, errcode.Errorf(errcode.CodeUnavailable, "receiver link closed")
		}
	}
}

// onEpoch returns the connection only if it is still the one of epoch: a
// binding attached on an earlier connection is fenced.
func (r *Receiver) onEpoch(epoch uint64) (ReceiverConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil || r.epoch != epoch {
		return nil, errFencedEpoch
	}
	return r.conn, nil
}

var errFencedEpoch = errors.New("receiver connection changed since the last attach")

// Close stops redialing, closes the connection and joins the maintainer.
// Safe to call twice.
func (r *Receiver) Close() error {
	r.stop()
	<-r.done
	return nil
}

// String shows the delay range.
func (b Backoff) String() string { return fmt.Sprintf("%s..%s", b.Min, b.Max) }
