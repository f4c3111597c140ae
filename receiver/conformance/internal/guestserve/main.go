// Command guestserve is the receiver side of the conformance suite's
// virtio-serial test (receiver/conformance.TestIntegrationVirtioSerial).
// It runs inside a QEMU guest and serves the wire protocol on one
// virtio-serial port through transport.Stream, exactly as the receiver
// would, with a test handler:
//
//   - stat answers {type: op_key, size: len(path)}; write answers the
//     content's size and SHA-256, so every answer is tied to its request;
//   - attach with op_key "c-*" waits until 32 such requests are in flight
//     (multiplexing); "block" holds until the server has begun to drain
//     (it closes its listener only after it marked itself draining), so it
//     is in flight across the start of the shutdown; "shutdown" waits until
//     a "block" is in flight, then starts a graceful shutdown of the
//     server. Every step waits for an event, never for time.
//
// It prints "guestserve: listening" when ready and exits 0 once the server
// has shut down.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireserver"
)

func main() { os.Exit(run(context.Background())) }

func run(ctx context.Context) int {
	dev := flag.String("dev", "", "virtio-serial character device to serve on")
	flag.Parse()
	if *dev == "" {
		fmt.Fprintln(os.Stderr, "guestserve: --dev is required")
		return 2
	}
	h := &handler{barrier: make(chan struct{}), shut: make(chan error, 1),
		blocked: make(chan struct{}), draining: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(os.Stdout, nil))
	srv, err := wireserver.NewServer(h, wireserver.ServerConfig{Log: log})
	if err != nil {
		fmt.Println("guestserve:", err)
		return 1
	}
	h.srv = srv
	l, err := transport.Stream{Path: *dev, HostOnly: true, PollInterval: 20 * time.Millisecond, Log: log}.Listen(ctx)
	if err != nil {
		fmt.Println("guestserve:", err)
		return 1
	}
	fmt.Println("guestserve: listening on", *dev)
	err = srv.Serve(ctx, &closeListener{Listener: l, closed: h.draining})
	fmt.Println("guestserve: served:", err)
	if !errors.Is(err, wireserver.ErrServerClosed) {
		return 1
	}
	if err := <-h.shut; err != nil {
		fmt.Println("guestserve: shutdown:", err)
		return 1
	}
	return 0
}

type handler struct {
	srv       *wireserver.Server
	mu        sync.Mutex
	waiting   int
	barrier   chan struct{}
	once      sync.Once
	shut      chan error
	blockOnce sync.Once
	blocked   chan struct{} // closed when a "block" request is in flight
	draining  chan struct{} // closed when the server closes its listener
}

// closeListener closes closed when the server closes it, which Shutdown
// does after marking the server draining.
type closeListener struct {
	transport.Listener
	closed chan struct{}
	once   sync.Once
}

func (l *closeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

func (h *handler) Serve(ctx context.Context, req *wire.Request) (any, error) {
	args, err := req.DecodeArgs()
	if err != nil {
		return nil, err
	}
	switch a := args.(type) {
	case *wire.StatArgs:
		return wire.StatResult{Type: req.OpKey, Size: int64(len(a.Path))}, nil
	case *wire.WriteArgs:
		sum := sha256.Sum256([]byte(a.Content))
		return wire.WriteResult{Size: int64(len(a.Content)), SHA256: hex.EncodeToString(sum[:])}, nil
	case *wire.AttachArgs:
		return h.attach(ctx, req.OpKey)
	}
	return nil, errcode.Errorf(errcode.CodeDenied, "op %s not served here", req.Op)
}

func (h *handler) attach(ctx context.Context, key string) (any, error) {
	switch {
	case strings.HasPrefix(key, "c-"):
		h.mu.Lock()
		if h.waiting++; h.waiting == 32 {
			close(h.barrier)
		}
		h.mu.Unlock()
		select {
		case <-h.barrier:
			return wire.Empty{}, nil
		case <-ctx.Done():
			return nil, errcode.Errorf(errcode.CodeTimeout, "not all 32 requests arrived together")
		}
	case key == "block":
		h.blockOnce.Do(func() { close(h.blocked) })
		select {
		case <-h.draining:
			return wire.Empty{}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case key == "shutdown":
		select {
		case <-h.blocked:
		case <-ctx.Done():
			return nil, errcode.Errorf(errcode.CodeTimeout, "no block request arrived before the shutdown request's deadline")
		}
		h.once.Do(func() {
			go func() { // joined: run waits on h.shut
				sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				h.shut <- h.srv.Shutdown(sctx)
			}()
		})
		return wire.Empty{}, nil
	}
	return nil, errcode.Errorf(errcode.CodeInvalid, "unknown test key %q", key)
}
