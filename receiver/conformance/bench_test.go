package conformance

import (
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// The round-trip benchmarks pair each transport with its own baseline: the
// same request and answer bytes exchanged raw (write, read back) over the
// same kind of connection, with no decoding and no goroutine per request.
// The ratio wire/raw is the protocol's cost on that transport:
//
//	go test ./receiver/conformance -run '^$' -bench RoundTrip -benchtime 2s

func BenchmarkRoundTrip(b *testing.B) {
	for _, tc := range []struct {
		name  string
		setup Setup
	}{
		{"unix", unixSetup},
		{"tls", tlsSetup},
	} {
		b.Run(tc.name+"/wire", func(b *testing.B) { benchWire(b, tc.setup) })
		b.Run(tc.name+"/raw", func(b *testing.B) { benchRaw(b, tc.setup) })
	}
}

var noop = wireserver.HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) { return nil, nil })

func benchWire(b *testing.B, setup Setup) {
	l, dial := setup(b)
	srv, _ := wireserver.NewServer(noop, wireserver.ServerConfig{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), l) }()
	defer func() { srv.Close(); <-served }()
	conn, err := dial(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	c, _ := wireclient.NewClient(conn, wireclient.ClientConfig{})
	defer c.Close()
	ctx := context.Background()
	deadline := time.Now().Add(time.Hour)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := c.Call(ctx, wire.OpAttach, Digest, "bench-key", deadline, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// requestAndAnswer returns the exact frames one no-op call exchanges.
func requestAndAnswer() ([]byte, []byte) {
	req, _ := json.Marshal(&wire.Request{ID: 1, Op: wire.OpAttach, TupleSHA256: Digest, OpKey: "bench-key",
		Deadline: time.Now().Add(time.Hour).UTC(), Args: json.RawMessage(`{}`)})
	resp, _ := json.Marshal(&wire.Response{ID: 1, Result: json.RawMessage(`{}`)})
	rf, _ := wire.AppendFrame(nil, req, 0)
	af, _ := wire.AppendFrame(nil, resp, 0)
	return rf, af
}

func benchRaw(b *testing.B, setup Setup) {
	l, dial := setup(b)
	reqF, ansF := requestAndAnswer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s, err := l.Accept(context.Background())
		if err != nil {
			return
		}
		defer s.Close()
		buf := make([]byte, len(reqF))
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(ansF); err != nil {
				return
			}
		}
	}()
	conn, err := dial(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, len(ansF))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := conn.Write(reqF); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	conn.Close()
	<-done
}
