package transport

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/mdlayher/vsock"

	"github.com/tetherdev/tether/fixtures/testenv"
)

func TestVsockRefusedWithoutHostOnly(t *testing.T) {
	v := Vsock{CID: 3, Port: 5000}
	if _, err := v.Listen(testCtx(t)); !errors.Is(err, ErrNotHostOnly) {
		t.Fatalf("Listen err = %v, want ErrNotHostOnly", err)
	}
	if _, err := v.Dial(testCtx(t)); !errors.Is(err, ErrNotHostOnly) {
		t.Fatalf("Dial err = %v, want ErrNotHostOnly", err)
	}
	if _, err := (Vsock{HostOnly: true}).Listen(testCtx(t)); !errors.Is(err, ErrConfig) {
		t.Fatalf("port 0: %v", err)
	}
}

// Only the configured peer context id is accepted: a process inside the
// guest (loopback CID 1, or the guest's own CID) must not reach the
// receiver through its vsock port.
func TestVsockPeerCID(t *testing.T) {
	cases := []struct {
		addr net.Addr
		ok   bool
	}{
		{&vsock.Addr{ContextID: vsock.Host, Port: 1234}, true},
		{&vsock.Addr{ContextID: vsock.Local, Port: 1234}, false},
		{&vsock.Addr{ContextID: 3, Port: 1234}, false},
		{&vsock.Addr{ContextID: vsock.Hypervisor, Port: 1234}, false},
		{&net.UnixAddr{Name: "x", Net: "unix"}, false},
	}
	for _, c := range cases {
		err := checkPeerCID(c.addr, HostCID)
		if (err == nil) != c.ok {
			t.Errorf("%v: err = %v, want ok=%v", c.addr, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrPeerRefused) {
			t.Errorf("%v: %v does not match ErrPeerRefused", c.addr, err)
		}
	}
}

// TestIntegrationVsockListen binds a real AF_VSOCK listener. This machine
// is itself a guest without a loopback transport, so no peer can connect:
// what is checked is binding, Accept obeying ctx, and Close.
func TestIntegrationVsockListen(t *testing.T) {
	testenv.Require(t, "vsock")
	l, err := Vsock{Port: 47001, HostOnly: true}.Listen(testCtx(t))
	if err != nil {
		t.Fatalf("vsock listen (the kernel needs AF_VSOCK): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept: %v, want DeadlineExceeded", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Accept(testCtx(t)); err == nil {
		t.Fatal("Accept after Close succeeded")
	}
}
