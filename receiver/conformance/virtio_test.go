package conformance

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/guest"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// TestIntegrationVirtioSerial runs the receiver side in a QEMU guest (TCG)
// on a real virtio-serial port through transport.Stream, and the client on
// the host through QEMU's chardev socket (transport.Unix, host-only): the
// deployment topology of the byte-stream transport. It checks a round trip
// with a 900 KiB frame, 32 concurrent multiplexed requests, a framing
// violation (notice, then the port is reopened for the next client), and a
// graceful shutdown that refuses new requests and answers the one in
// flight, after which the guest's server exits 0.
func TestIntegrationVirtioSerial(t *testing.T) {
	testenv.Require(t, "root", "qemu")
	k, err := guest.FindKernel()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "guestserve")
	if err := guest.BuildGo(ctx, ".", "./internal/guestserve", bin); err != nil {
		t.Fatal(err)
	}
	script := `for p in /sys/class/virtio-ports/*; do
  [ "$(cat $p/name)" = tether.receiver ] && dev=/dev/${p##*/}
done
exec /bin/guestserve --dev "$dev"`
	img, err := guest.Build(ctx, guest.Spec{Kernel: k, Modules: guest.ModulesVirtioSerial,
		Files: []guest.File{{Path: "/bin/guestserve", Source: bin, Mode: 0o755}}, Script: script},
		filepath.Join(dir, "initramfs.cpio"))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "port.sock")
	args := append(guest.VirtioSerialBus(), guest.VirtioSerialPort("c0", "tether.receiver", sock)...)
	vm, err := guest.Start(ctx, guest.Config{Kernel: k, Initramfs: img.Path, Args: args, ConsoleLog: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if _, err := vm.WaitFor(ctx, regexp.MustCompile(`^guestserve: listening on /dev/vport`)); err != nil {
		t.Fatal(err)
	}
	host := transport.Unix{Path: sock, HostOnly: true}

	c := dialClient(ctx, t, host)
	virtioRoundTrip(ctx, t, c)
	virtioConcurrent(ctx, t, c)
	c.Close()
	virtioViolation(ctx, t, host)
	c = reconnect(ctx, t, host)
	virtioRoundTrip(ctx, t, c)
	virtioShutdown(ctx, t, c)
	c.Close()
	if code, err := vm.Wait(ctx); err != nil || code != 0 {
		t.Fatalf("guest server exit = %d, %v; want 0 after a clean shutdown", code, err)
	}
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func dialClient(ctx context.Context, t *testing.T, host transport.Unix) *wireclient.Client {
	t.Helper()
	conn, err := host.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := wireclient.NewClient(conn, wireclient.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// reconnect dials until the guest serves the port again after a
// violation. A request that reaches the guest before it has closed its end
// is discarded by the guest kernel (virtio_console drops unread data on
// close), so a first attempt may end as fate_unknown: it must never end
// any other way, and the port must come back.
func reconnect(ctx context.Context, t *testing.T, host transport.Unix) *wireclient.Client {
	t.Helper()
	_, c := reconnectRaw(ctx, t, host)
	return c
}

// reconnectRaw is reconnect, also returning the connection under the
// client (the caller may write raw bytes on it once the probe was served).
func reconnectRaw(ctx context.Context, t *testing.T, host transport.Unix) (io.Writer, *wireclient.Client) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		conn, err := host.Dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c, err := wireclient.NewClient(conn, wireclient.ClientConfig{})
		if err != nil {
			t.Fatal(err)
		}
		var res wire.StatResult
		err = c.Call(ctx, wire.OpStat, Digest, "probe", time.Now().Add(3*time.Second), &wire.StatArgs{Path: "p"}, &res)
		if err == nil && res.Type == "probe" {
			return conn, c
		}
		c.Close()
		if codeOf(err) != errcode.CodeFateUnknown && codeOf(err) != errcode.CodeTimeout || attempt == 10 {
			t.Fatalf("reconnect attempt %d: %v (answer %+v)", attempt, err, res)
		}
		t.Logf("reconnect attempt %d: %v", attempt, err)
	}
}

func virtioRoundTrip(ctx context.Context, t *testing.T, c *wireclient.Client) {
	t.Helper()
	var res wire.StatResult
	if err := c.Call(ctx, wire.OpStat, Digest, "rt-1", soon(), &wire.StatArgs{Path: "dir/é"}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Type != "rt-1" || res.Size != int64(len("dir/é")) {
		t.Fatalf("answer %+v", res)
	}
	var b strings.Builder
	for i := 0; b.Len() < 900<<10; i++ {
		b.WriteRune(rune(1 + i%0x7ff))
	}
	var wr wire.WriteResult
	if err := c.Call(ctx, wire.OpWrite, Digest, "rt-2", soon(), &wire.WriteArgs{Path: "f", Content: b.String()}, &wr); err != nil {
		t.Fatal(err)
	}
	if wr.Size != int64(b.Len()) || wr.SHA256 != sha(b.String()) {
		t.Fatalf("900 KiB write arrived as %d bytes %s", wr.Size, wr.SHA256)
	}
}

func virtioConcurrent(ctx context.Context, t *testing.T, c *wireclient.Client) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Go(func() {
			errs <- c.Call(ctx, wire.OpAttach, Digest, fmt.Sprintf("c-%d", i), soon(), nil, nil)
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

// virtioViolation sends a frame header over the limit through the port:
// the guest answers with a notice and closes (then reopens) its end. The
// header goes out on a connection the guest has just served (a probe), so
// it cannot fall into the instant the guest reopens the port after the
// previous client (when the guest kernel drops what arrives).
func virtioViolation(ctx context.Context, t *testing.T, host transport.Unix) {
	t.Helper()
	conn, c := reconnectRaw(ctx, t, host)
	defer c.Close()
	if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, wire.MaxFrameSize+1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("no notice: the connection is still up after an oversize frame header")
	}
	if err := c.Err(); !errors.Is(err, &errcode.Error{Code: errcode.CodeInvalid}) {
		t.Fatalf("connection ended with %v, want the receiver's invalid notice", err)
	}
}

// virtioShutdown: a request in flight when the guest starts shutting down
// is answered; the client then sees the shutdown notice, closes the
// connection itself (the guest's close of the port is invisible here) and
// refuses later calls unsent. The guest orders the steps ("shutdown" waits
// for "block" to be in flight, "block" ends only once the server drains),
// so nothing waits for time. (The server refusing a request that arrives
// while it drains is checked on a pty byte stream by TestStreamPty.)
func virtioShutdown(ctx context.Context, t *testing.T, c *wireclient.Client) {
	t.Helper()
	blocked := make(chan error, 1)
	go func() { blocked <- c.Call(ctx, wire.OpAttach, Digest, "block", soon(), nil, nil) }()
	if err := c.Call(ctx, wire.OpAttach, Digest, "shutdown", soon(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; err != nil {
		t.Fatalf("request in flight across shutdown: %v", err)
	}
	select {
	case <-c.Done():
		if !errors.Is(c.Err(), wireclient.ErrReceiverShutdown) {
			t.Fatalf("client ended with %v, want ErrReceiverShutdown", c.Err())
		}
	case <-ctx.Done():
		t.Fatal("client still open after the receiver's shutdown")
	}
	if err := c.Call(ctx, wire.OpStat, Digest, "late", soon(), &wire.StatArgs{Path: "x"}, nil); codeOf(err) != errcode.CodeUnavailable {
		t.Fatalf("call after the shutdown: %v, want unavailable", err)
	}
}
