package wireserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/internal/socktest"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// statHandler answers stat with the path's length as size, so each answer
// is tied to its own request.
var statHandler = HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
	args, err := req.DecodeArgs()
	if err != nil {
		return nil, err
	}
	return wire.StatResult{Type: "file", Size: int64(len(args.(*wire.StatArgs).Path))}, nil
})

func TestCallRoundTrip(t *testing.T) {
	var seen atomic.Pointer[wire.Request]
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		seen.Store(req)
		return statHandler(ctx, req)
	})
	cl, _ := pair(t, h, ServerConfig{})
	deadline := time.Now().Add(5 * time.Second).Truncate(time.Millisecond)
	var res wire.StatResult
	if err := cl.Call(testCtx(t), wire.OpStat, testDigest, testOpKey, deadline, &wire.StatArgs{Path: "hello"}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Size != 5 || res.Type != "file" {
		t.Fatalf("result %+v", res)
	}
	req := seen.Load()
	if req.TupleSHA256 != testDigest || req.OpKey != testOpKey || !req.Deadline.Equal(deadline) || req.ID == 0 {
		t.Fatalf("server saw %+v", req)
	}
}

// The request deadline is the earlier of the argument and ctx's deadline,
// and the handler's ctx ends there.
func TestCallDeadlineIsEarliest(t *testing.T) {
	got := make(chan time.Time, 2)
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		dl, _ := ctx.Deadline()
		got <- dl
		return nil, nil
	})
	cl, _ := pair(t, h, ServerConfig{})
	ctxDL := time.Now().Add(20 * time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), ctxDL)
	defer cancel()
	if err := cl.Call(ctx, wire.OpAttach, testDigest, testOpKey, time.Now().Add(time.Hour), nil, nil); err != nil {
		t.Fatal(err)
	}
	if dl := <-got; !dl.Equal(ctxDL.Round(0)) && dl.Sub(ctxDL).Abs() > time.Microsecond {
		t.Fatalf("handler deadline %v, want ctx's %v", dl, ctxDL)
	}
	argDL := time.Now().Add(15 * time.Second)
	if err := cl.Call(context.Background(), wire.OpAttach, testDigest, testOpKey, argDL, nil, nil); err != nil {
		t.Fatal(err)
	}
	if dl := <-got; dl.Sub(argDL).Abs() > time.Microsecond {
		t.Fatalf("handler deadline %v, want argument's %v", dl, argDL)
	}
	err := cl.Call(context.Background(), wire.OpAttach, testDigest, testOpKey, time.Time{}, nil, nil)
	if codeOf(err) != errcode.CodeInvalid {
		t.Fatalf("no deadline anywhere: err = %v, want CodeInvalid", err)
	}
}

// 32 calls in flight at once on one connection: every handler waits until
// all 32 have arrived, which only multiplexing allows.
func TestCallConcurrentMultiplexed(t *testing.T) {
	const n = 32
	var arrived sync.WaitGroup
	arrived.Add(n)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		arrived.Done()
		select {
		case <-all:
		case <-ctx.Done():
			return nil, errcode.Errorf(errcode.CodeTimeout, "not all %d requests arrived", n)
		}
		return statHandler(ctx, req)
	})
	cl, _ := pair(t, h, ServerConfig{})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			path := strings.Repeat("p", i+1)
			var res wire.StatResult
			err := cl.Call(testCtx(t), wire.OpStat, testDigest, fmt.Sprintf("k%d", i), soon(), &wire.StatArgs{Path: path}, &res)
			if err == nil && res.Size != int64(i+1) {
				err = fmt.Errorf("call %d got the answer of another call: size %d", i, res.Size)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// Nothing that fails local checks is sent.
func TestCallRefusesBeforeSending(t *testing.T) {
	cc, sc := socktest.Pair(t)
	cl, err := wireclient.NewClient(cc, wireclient.ClientConfig{MaxFrame: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := testCtx(t)
	cases := []struct {
		name string
		op   wire.Op
		args any
		want errcode.Code
	}{
		{"unknown op", "rm", nil, errcode.CodeInvalid},
		{"args of another op", wire.OpWrite, &wire.ReadArgs{Path: "x"}, errcode.CodeInvalid},
		{"over the frame limit", wire.OpWrite, &wire.WriteArgs{Path: "x", Content: strings.Repeat("a", 5000)}, errcode.CodeTooLarge},
	}
	for _, c := range cases {
		if err := cl.Call(ctx, c.op, testDigest, testOpKey, soon(), c.args, nil); codeOf(err) != c.want {
			t.Errorf("%s: err = %v, want %s", c.name, err, c.want)
		}
	}
	if err := cl.Call(ctx, wire.OpAttach, testDigest, testOpKey, time.Now().Add(-time.Second), nil, nil); codeOf(err) != errcode.CodeTimeout {
		t.Errorf("past deadline: err = %v, want timeout", err)
	}
	_ = sc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _ := sc.Read(make([]byte, 1)); n != 0 {
		t.Fatal("a refused call wrote to the connection")
	}
}

// A broken connection fails every call in flight as fate unknown, later
// calls as unavailable, and nothing is ever sent twice.
func TestCallConnectionLossIsFateUnknownNoResend(t *testing.T) {
	cc, sc := socktest.Pair(t)
	cl, err := wireclient.NewClient(cc, wireclient.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	peer := newRawPeer(t, sc)
	const n = 5
	errs := make(chan error, n)
	for i := range n {
		go func() {
			errs <- cl.Call(testCtx(t), wire.OpStat, testDigest, fmt.Sprintf("k%d", i), soon(), &wire.StatArgs{Path: "x"}, nil)
		}()
	}
	for range n {
		var req wire.Request
		peer.next(&req)
	}
	sc.Close() // the receiver's end goes away with all five in flight
	for range n {
		err := <-errs
		if codeOf(err) != errcode.CodeFateUnknown {
			t.Fatalf("in-flight call: err = %v, want fate_unknown", err)
		}
	}
	<-cl.Done()
	if cl.Err() == nil {
		t.Fatal("Err() is nil after the connection broke")
	}
	if err := cl.Call(testCtx(t), wire.OpStat, testDigest, "k9", soon(), &wire.StatArgs{Path: "x"}, nil); codeOf(err) != errcode.CodeUnavailable {
		t.Fatalf("call after loss: err = %v, want unavailable", err)
	}
}

// ctx ending abandons the wait: the call is fate unknown (it was sent) and
// wraps ctx's error; the late answer is dropped without harm.
func TestCallCtxCancelAfterSend(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})
	cl, _ := pair(t, h, ServerConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }() // the request was sent: it is running
	err := cl.Call(ctx, wire.OpAttach, testDigest, testOpKey, soon(), nil, nil)
	if codeOf(err) != errcode.CodeFateUnknown || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want fate_unknown wrapping context.Canceled", err)
	}
	close(release) // the late answer arrives and must be dropped
	if err := cl.Call(testCtx(t), wire.OpAttach, testDigest, testOpKey, soon(), nil, nil); err != nil {
		t.Fatalf("connection unusable after a dropped late answer: %v", err)
	}
}

func TestClientCloseIdempotent(t *testing.T) {
	started := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	cl, _ := pair(t, h, ServerConfig{})
	inflight := make(chan error, 1)
	go func() { inflight <- cl.Call(testCtx(t), wire.OpAttach, testDigest, testOpKey, soon(), nil, nil) }()
	<-started
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cl.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case <-cl.Done(): // reader joined
	default:
		t.Fatal("Close returned before the reader goroutine ended")
	}
	if err := <-inflight; codeOf(err) != errcode.CodeFateUnknown {
		t.Fatalf("in-flight call at Close: %v, want fate_unknown", err)
	}
	err := cl.Call(testCtx(t), wire.OpAttach, testDigest, testOpKey, soon(), nil, nil)
	if codeOf(err) != errcode.CodeUnavailable || !strings.Contains(err.Error(), "client closed") {
		t.Fatalf("call after Close: %v, want unavailable (client closed)", err)
	}
}

// A receiver that answers an id never sent, or sends garbage, ends the
// connection; the calls in flight become fate unknown.
func TestClientRefusesBadAnswers(t *testing.T) {
	for name, answer := range map[string]string{
		"unsent id":      `{"id":99,"result":{}}`,
		"unknown field":  `{"id":1,"result":{},"x":1}`,
		"unknown code":   `{"id":1,"error":{"code":"ok_really","message":""}}`,
		"both":           `{"id":1,"result":{},"error":{"code":"denied","message":""}}`,
		"not an object":  `"hi"`,
		"trailing bytes": `{"id":1,"result":{}}{}`,
		// The frame decoder leaves the result's syntax to the result's own
		// decode (or json.Valid when the caller wants no result).
		"result not json":   `{"id":1,"result":tru}`,
		"result bad escape": `{"id":1,"result":{"granted":"\q"}}`,
	} {
		for _, result := range []any{nil, &wire.AttachResult{}} {
			t.Run(fmt.Sprintf("%s/%T", name, result), func(t *testing.T) {
				refusesBadAnswer(t, answer, result)
			})
		}
	}
}

// refusesBadAnswer: the call in flight becomes fate unknown and the
// connection ends with a protocol fault when the peer answers answer.
func refusesBadAnswer(t *testing.T, answer string, result any) {
	cc, sc := socktest.Pair(t)
	cl, _ := wireclient.NewClient(cc, wireclient.ClientConfig{})
	defer cl.Close()
	peer := newRawPeer(t, sc)
	done := make(chan error, 1)
	go func() { done <- cl.Call(testCtx(t), wire.OpAttach, testDigest, testOpKey, soon(), nil, result) }()
	var req wire.Request
	peer.next(&req)
	peer.sendRaw([]byte(answer))
	if err := <-done; codeOf(err) != errcode.CodeFateUnknown {
		t.Fatalf("err = %v, want fate_unknown", err)
	}
	if err := cl.Err(); !errors.Is(err, wire.ErrMalformed) && !errors.Is(err, wire.ErrProtocol) {
		t.Fatalf("Err() = %v, want a protocol fault", err)
	}
	peer.expectEOF()
}

// The result is decoded strictly too.
func TestCallResultStrict(t *testing.T) {
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		return json.RawMessage(`{"type":"file","size":1,"surprise":true}`), nil
	})
	cl, _ := pair(t, h, ServerConfig{})
	var res wire.StatResult
	err := cl.Call(testCtx(t), wire.OpStat, testDigest, testOpKey, soon(), &wire.StatArgs{Path: "x"}, &res)
	if !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
}

// A violation notice ends the connection on the client side at once: on a
// byte stream the receiver closing its end is not visible otherwise.
func TestClientEndsConnectionOnViolationNotice(t *testing.T) {
	cc, sc := socktest.Pair(t)
	cl, _ := wireclient.NewClient(cc, wireclient.ClientConfig{})
	defer cl.Close()
	peer := newRawPeer(t, sc)
	done := make(chan error, 1)
	go func() { done <- cl.Call(testCtx(t), wire.OpAttach, testDigest, testOpKey, soon(), nil, nil) }()
	var req wire.Request
	peer.next(&req)
	peer.send(wire.Response{ID: 0, Error: errcode.Errorf(errcode.CodeInvalid, "frame too large")})
	if err := <-done; codeOf(err) != errcode.CodeFateUnknown {
		t.Fatalf("in-flight call: %v, want fate_unknown", err)
	}
	if !errors.Is(cl.Err(), &errcode.Error{Code: errcode.CodeInvalid}) {
		t.Fatalf("Err() = %v, want the notice", cl.Err())
	}
	peer.expectEOF()
}

// A call whose ctx has already ended is not sent.
func TestCallCtxDoneIsNotSent(t *testing.T) {
	cc, sc := socktest.Pair(t)
	cl, _ := wireclient.NewClient(cc, wireclient.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20 { // the writer slot is free: a random select would sometimes send
		err := cl.Call(ctx, wire.OpAttach, testDigest, testOpKey, soon(), nil, nil)
		if !errors.Is(err, context.Canceled) || codeOf(err) == errcode.CodeFateUnknown {
			t.Fatalf("err = %v, want context.Canceled and not fate_unknown", err)
		}
	}
	_ = sc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _ := sc.Read(make([]byte, 1)); n != 0 {
		t.Fatal("a call with a dead ctx wrote to the connection")
	}
}

// A call whose ctx deadline has passed is not sent and says timeout, a
// code the custodian passes on (an uncoded error became "internal").
func TestCallCtxDeadlineIsTimeoutNotSent(t *testing.T) {
	cc, sc := socktest.Pair(t)
	cl, _ := wireclient.NewClient(cc, wireclient.ClientConfig{})
	defer cl.Close()
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err := cl.Call(ctx, wire.OpAttach, testDigest, testOpKey, soon(), nil, nil)
	if codeOf(err) != errcode.CodeTimeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want timeout wrapping context.DeadlineExceeded", err)
	}
	_ = sc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _ := sc.Read(make([]byte, 1)); n != 0 {
		t.Fatal("a call past its deadline wrote to the connection")
	}
}

// After the shutdown notice the client refuses new calls at once, lets the
// calls in flight get their answers, then closes the connection itself
// (Done), because on a byte stream the receiver's close would never show.
// Answers are routed in stream order, so once the answer the peer sent
// after the notice is in, the notice has been seen: no step waits for time.
func TestClientClosesAfterDrain(t *testing.T) {
	cc, sc := socktest.Pair(t)
	cl, _ := wireclient.NewClient(cc, wireclient.ClientConfig{})
	defer cl.Close()
	peer := newRawPeer(t, sc)
	done := make(chan error, 2)
	var reqs [2]wire.Request
	for i := range reqs {
		go func() { done <- cl.Call(testCtx(t), wire.OpAttach, testDigest, fmt.Sprint("k", i), soon(), nil, nil) }()
		peer.next(&reqs[i])
	}
	peer.send(wire.Response{ID: 0, Error: errcode.Errorf(errcode.CodeUnavailable, "receiver shutting down")})
	peer.send(wire.Response{ID: reqs[0].ID, Result: json.RawMessage(`{}`)})
	if err := <-done; err != nil {
		t.Fatalf("call in flight across the notice: %v", err)
	}
	for range 3 {
		if err := cl.Call(testCtx(t), wire.OpAttach, testDigest, "late", soon(), nil, nil); codeOf(err) != errcode.CodeUnavailable {
			t.Fatalf("call after the notice: %v, want unavailable", err)
		}
	}
	select {
	case <-cl.Done():
		t.Fatalf("connection closed with a call still in flight: %v", cl.Err())
	default:
	}
	peer.send(wire.Response{ID: reqs[1].ID, Result: json.RawMessage(`{}`)})
	if err := <-done; err != nil {
		t.Fatalf("second call in flight across the notice: %v", err)
	}
	select {
	case <-cl.Done():
	case <-testCtx(t).Done():
		t.Fatal("connection not closed after the last answer")
	}
	if !errors.Is(cl.Err(), wireclient.ErrReceiverShutdown) {
		t.Fatalf("Err() = %v, want ErrReceiverShutdown", cl.Err())
	}
	peer.expectEOF() // the refused calls were never written
}

// No answer by the deadline plus the grace ends the connection: every call
// in flight is fate unknown and Done fires, so a caller redials instead of
// waiting on a receiver that is gone (invisible on a byte stream).
func TestClientNoAnswerEndsConnection(t *testing.T) {
	cc, sc := socktest.Pair(t)
	cl, _ := wireclient.NewClient(cc, wireclient.ClientConfig{ResponseGrace: 20 * time.Millisecond})
	defer cl.Close()
	peer := newRawPeer(t, sc)
	other := make(chan error, 1)
	go func() { other <- cl.Call(testCtx(t), wire.OpAttach, testDigest, "k-long", soon(), nil, nil) }()
	var req wire.Request
	peer.next(&req) // the long call is in flight
	// The deadline leaves the call time to be sent even on a slow machine
	// (a deadline passed before sending is refused unsent, as timeout).
	err := cl.Call(testCtx(t), wire.OpAttach, testDigest, "k-short", time.Now().Add(500*time.Millisecond), nil, nil)
	if codeOf(err) != errcode.CodeFateUnknown || !errors.Is(err, wireclient.ErrNoAnswer) {
		t.Fatalf("unanswered call: %v, want fate_unknown wrapping ErrNoAnswer", err)
	}
	if err := <-other; codeOf(err) != errcode.CodeFateUnknown {
		t.Fatalf("other call in flight: %v, want fate_unknown", err)
	}
	select {
	case <-cl.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("connection still up after an unanswered deadline")
	}
	if !errors.Is(cl.Err(), wireclient.ErrNoAnswer) {
		t.Fatalf("Err() = %v", cl.Err())
	}
}
