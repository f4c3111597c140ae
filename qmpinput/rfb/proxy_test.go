package rfb

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// fakeQEMU records every byte a session forwards to "QEMU".
type fakeQEMU struct {
	mu   sync.Mutex
	got  bytes.Buffer
	done chan struct{}
}

func (f *fakeQEMU) read(c net.Conn) {
	defer close(f.done)
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		f.mu.Lock()
		f.got.Write(buf[:n])
		f.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// messages parses what the fake received.
func (f *fakeQEMU) messages(t *testing.T) []Msg {
	t.Helper()
	<-f.done
	var out []Msg
	r := bytes.NewReader(f.got.Bytes())
	for r.Len() > 0 {
		m, err := ReadClientMessage(r)
		if err != nil {
			t.Fatalf("the session forwarded bytes that do not parse: %v", err)
		}
		out = append(out, m)
	}
	return out
}

// runFake runs a session (no refresh nudge) between the returned viewer
// end and a recording QEMU; it returns once the viewer's writes are sent.
func runFake(t *testing.T, gate Gate, viewerBytes ...[]byte) ([]Msg, error, *Stats) {
	t.Helper()
	viewerEnd, proxyEnd := net.Pipe()
	qemuEnd, fakeEnd := net.Pipe()
	f := &fakeQEMU{done: make(chan struct{})}
	go f.read(fakeEnd)
	s := NewSession(proxyEnd, qemuEnd, gate)
	s.RefreshEvery = 0
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	go func() {
		for _, b := range viewerBytes {
			if _, err := viewerEnd.Write(b); err != nil {
				return
			}
		}
		viewerEnd.Close()
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("session did not end")
	}
	return f.messages(t), err, s.Stats()
}

func concat(ms ...Msg) []byte {
	var b []byte
	for _, m := range ms {
		b = append(b, m.Encode()...)
	}
	return b
}

// TestSessionForwardsOnlyParsedAllowedMessages: clipboard never reaches
// QEMU, encodings are filtered, input passes only through an open gate,
// and everything forwarded parses.
func TestSessionForwardsOnlyParsedAllowedMessages(t *testing.T) {
	cut := []byte{6, 0, 0, 0, 0, 0, 0, 5, 's', 'e', 'c', 'r', 't'}
	in := concat(SetPixelFormat{Format: rawFormat}, SetEncodings{Encodings: []int32{7, -309, int32(-0x3f5e1a32), 0}})
	in = append(in, cut...)
	in = append(in, concat(KeyEvent{Down: true, Keysym: xkA}, PointerEvent{Mask: 1, X: 3, Y: 4}, UpdateRequest{Incremental: true, W: 10, H: 10})...)
	for _, open := range []bool{false, true} {
		g := &switchGate{}
		g.open.Store(open)
		got, err, st := runFake(t, g, in)
		if err != nil {
			t.Fatal(err)
		}
		want := []Msg{SetPixelFormat{Format: rawFormat}, SetEncodings{Encodings: []int32{7, 0}}}
		if open {
			want = append(want, KeyEvent{Down: true, Keysym: xkA}, PointerEvent{Mask: 1, X: 3, Y: 4})
		}
		want = append(want, UpdateRequest{Incremental: true, W: 10, H: 10})
		if !equalMsgs(got, want) {
			t.Fatalf("gate open=%v: QEMU got %#v, want %#v", open, got, want)
		}
		if st.CutTextDropped.Load() != 1 || st.EncodingsRemoved.Load() != 2 {
			t.Fatalf("cut text dropped %d, encodings removed %d", st.CutTextDropped.Load(), st.EncodingsRemoved.Load())
		}
	}
}

func equalMsgs(a, b []Msg) bool {
	return bytes.Equal(concat(a...), concat(b...)) && len(a) == len(b)
}

// TestSessionMalformedIsFatal: a malformed message ends the session with
// a MalformedError and nothing after it is forwarded.
func TestSessionMalformedIsFatal(t *testing.T) {
	g := &switchGate{}
	g.open.Store(true)
	got, err, _ := runFake(t, g, KeyEvent{Down: true, Keysym: xkA}.Encode(), []byte{4, 7, 0, 0, 0, 0, 0, 0x62}, KeyEvent{Keysym: xkA}.Encode())
	var me *MalformedError
	if !errors.As(err, &me) || me.Type != 4 {
		t.Fatalf("session ended with %v, want a MalformedError for type 4", err)
	}
	if !equalMsgs(got, []Msg{KeyEvent{Down: true, Keysym: xkA}}) {
		t.Fatalf("QEMU got %#v", got)
	}
}

// TestSessionReleaseLiftsHeldInput: Release sends a key-up for each key
// still down (keysym and extended) and lifts the buttons.
func TestSessionReleaseLiftsHeldInput(t *testing.T) {
	viewerEnd, proxyEnd := net.Pipe()
	qemuEnd, fakeEnd := net.Pipe()
	f := &fakeQEMU{done: make(chan struct{})}
	go f.read(fakeEnd)
	g := &switchGate{}
	g.open.Store(true)
	s := NewSession(proxyEnd, qemuEnd, g)
	s.RefreshEvery = 0
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	viewerEnd.Write(concat(KeyEvent{Down: true, Keysym: xkA}, KeyEvent{Down: true, Keysym: xkB}, KeyEvent{Keysym: xkB},
		ExtKeyEvent{Down: true, Keysym: xkC, Keycode: 0x2e}, PointerEvent{Mask: 4, X: 7, Y: 8}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitCount(t, ctx, &s.Stats().InputForwarded, 5)
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	viewerEnd.Close()
	<-done
	got := f.messages(t)
	if len(got) != 8 {
		t.Fatalf("QEMU got %d messages %#v, want 5 and 3 releases", len(got), got)
	}
	rel := map[string]bool{}
	for _, m := range got[5:] {
		rel[string(m.Encode())] = true
	}
	for _, m := range []Msg{KeyEvent{Keysym: xkA}, ExtKeyEvent{Keysym: xkC, Keycode: 0x2e}, PointerEvent{X: 7, Y: 8}} {
		if !rel[string(m.Encode())] {
			t.Fatalf("releases %#v lack %#v", got[5:], m)
		}
	}
}

// TestHandshakeRefusals: a viewer that asks for another version or
// security type, and a QEMU that offers no None security, are refused.
func TestHandshakeRefusals(t *testing.T) {
	t.Run("viewer version 3.3", func(t *testing.T) {
		err := serverWith(t, func(c net.Conn) { io.ReadFull(c, make([]byte, 12)); c.Write([]byte("RFB 003.003\n")) })
		if !errors.Is(err, ErrHandshake) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("viewer picks VNC auth", func(t *testing.T) {
		err := serverWith(t, func(c net.Conn) {
			io.ReadFull(c, make([]byte, 12))
			c.Write([]byte(version38))
			io.ReadFull(c, make([]byte, 2))
			c.Write([]byte{2})
		})
		if !errors.Is(err, ErrHandshake) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("qemu with a password", func(t *testing.T) {
		a, b := net.Pipe()
		go func() {
			b.Write([]byte(version38))
			io.ReadFull(b, make([]byte, 12))
			b.Write([]byte{1, 2}) // VNC authentication only
			b.Close()
		}()
		if _, err := ClientHandshake(a); !errors.Is(err, ErrHandshake) {
			t.Fatalf("got %v", err)
		}
	})
}

func serverWith(t *testing.T, viewer func(net.Conn)) error {
	t.Helper()
	a, b := net.Pipe()
	go func() { viewer(b); b.Close() }()
	a.SetDeadline(time.Now().Add(10 * time.Second))
	return ServerHandshake(a, ServerInit{Width: 1, Height: 1, Format: rawFormat})
}
