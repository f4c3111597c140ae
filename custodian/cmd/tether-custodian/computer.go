package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/receiver/wire"
)

// computerFlags ask the computer service (tether-computer serve) for a
// fresh computer for one run, instead of a --config naming one.
type computerFlags struct {
	socket string
	keep   bool
	ttl    time.Duration
}

// releaseGrace bounds the delete of the run's computer at the end, even
// when the run itself was cancelled.
const releaseGrace = 30 * time.Second

func addComputerFlags(fs *flag.FlagSet) *computerFlags {
	f := &computerFlags{}
	fs.StringVar(&f.socket, "computer-socket", "", "ask the computer service listening on this unix socket ("+client.DefaultSocket+" is its default) for a fresh computer for this run, instead of --config; it is deleted when the run ends")
	fs.BoolVar(&f.keep, "keep-computer", false, "with --computer-socket: keep the computer when the run ends (tether-computer rm ID ends it)")
	fs.DurationVar(&f.ttl, "computer-ttl", time.Hour, "with --computer-socket: the computer's lease")
	return f
}

// acquire creates the run's computer and returns the path of its
// custodian configuration and the release the caller defers: it deletes
// the computer, unless --keep-computer, and says which it did.
func (f *computerFlags) acquire(ctx context.Context, stderr io.Writer) (string, func(), error) {
	c := client.Unix(f.socket)
	req := api.CreateRequest{LeaseTTLSeconds: int64(f.ttl / time.Second), Labels: map[string]string{"by": "tether-custodian-run"}}
	comp, err := c.Create(ctx, req)
	if err != nil {
		return "", func() {}, fmt.Errorf("computer service %s: create: %w", f.socket, err)
	}
	if comp.CustodianConfig == "" {
		_ = c.Delete(context.WithoutCancel(ctx), comp.ID)
		return "", func() {}, fmt.Errorf("computer service %s: computer %s came without a custodian configuration", f.socket, comp.ID)
	}
	fmt.Fprintf(stderr, "tether-custodian: computer %s from the service (lease until %s)\n", comp.ID, comp.LeaseExpiresAt.Format(time.RFC3339))
	release := func() {
		if f.keep {
			fmt.Fprintf(stderr, "tether-custodian: kept computer %s (tether-computer rm %s ends it)\n", comp.ID, comp.ID)
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseGrace)
		defer cancel()
		if err := c.Delete(rctx, comp.ID); err != nil {
			fmt.Fprintf(stderr, "tether-custodian: delete computer %s: %v\n", comp.ID, err)
			return
		}
		fmt.Fprintf(stderr, "tether-custodian: deleted computer %s\n", comp.ID)
	}
	return comp.CustodianConfig, release, nil
}

// wakeEvery bounds how often the custodian asks the service about its
// computer: a computer is suspended only after its idle timeout (minutes)
// with no callback, so one question a second is enough to find it.
const wakeEvery = time.Second

// waker tells the service that made the computer (custodian.Config.
// Computer) of each callback before it is forwarded, at most once a
// second, so that an active computer is not suspended and a suspended
// one is resumed.
type waker struct {
	cl     *client.Client
	id     string
	stderr io.Writer

	mu     sync.Mutex
	last   time.Time
	warned bool
}

func newWaker(ref *custodian.ComputerRef, stderr io.Writer) *waker {
	return &waker{cl: client.Unix(ref.Socket), id: ref.ID, stderr: stderr}
}

// wake touches the computer through the service: the service counts it
// as activity and resumes the computer if it is suspended. A service that
// cannot be asked is reported once and does not stop the call: the
// receiver still decides what it admits.
func (w *waker) wake(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Since(w.last) < wakeEvery {
		return
	}
	w.last = time.Now()
	if _, err := w.cl.Touch(ctx, w.id); err != nil && !w.warned {
		w.warned = true
		fmt.Fprintf(w.stderr, "tether-custodian: computer service: touch %s: %v (a suspended computer is not woken)\n", w.id, err)
	}
}

// wakingDialer wraps dial so that every call on its connections wakes
// the computer first.
func wakingDialer(dial custodian.Dialer, w *waker) custodian.Dialer {
	return func(ctx context.Context) (custodian.ReceiverConn, error) {
		conn, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		return &wakingConn{ReceiverConn: conn, w: w}, nil
	}
}

// wakingConn is a receiver connection that wakes the computer before
// each call.
type wakingConn struct {
	custodian.ReceiverConn
	w *waker
}

// CallChunk wakes the computer, then sends a binary write_chunk on the
// connection below, or the same chunk in JSON when it speaks no binary
// frames (then BinaryFrames is false and the custodian does not call it).
func (c *wakingConn) CallChunk(ctx context.Context, tupleSHA256, opKey string, fence uint64, deadline time.Time,
	args *wire.WriteChunkArgs, data []byte, result *wire.WriteChunkResult) error {
	c.w.wake(ctx)
	if bc, ok := c.ReceiverConn.(binaryChunker); ok && bc.BinaryFrames() {
		return bc.CallChunk(ctx, tupleSHA256, opKey, fence, deadline, args, data, result)
	}
	a := *args
	a.Data = data
	return c.ReceiverConn.CallFenced(ctx, wire.OpWriteChunk, tupleSHA256, opKey, fence, deadline, &a, result)
}

// BinaryFrames is the wrapped connection's: binary frames only when it
// speaks them.
func (c *wakingConn) BinaryFrames() bool {
	bc, ok := c.ReceiverConn.(binaryChunker)
	return ok && bc.BinaryFrames()
}

// binaryChunker is a connection that speaks binary data frames
// (wireclient.Client).
type binaryChunker interface {
	CallChunk(ctx context.Context, tupleSHA256, opKey string, fence uint64, deadline time.Time,
		args *wire.WriteChunkArgs, data []byte, result *wire.WriteChunkResult) error
	BinaryFrames() bool
}

func (c *wakingConn) CallFenced(ctx context.Context, op wire.Op, tupleSHA256, opKey string, fence uint64, deadline time.Time, args, result any) error {
	c.w.wake(ctx)
	return c.ReceiverConn.CallFenced(ctx, op, tupleSHA256, opKey, fence, deadline, args, result)
}
