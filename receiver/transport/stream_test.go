package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPty returns the master side of a new pty (raw) and the slave's
// path: the slave stands for the guest's virtio-serial port, the master
// for the host's end of it.
func openPty(t testing.TB) (*os.File, string) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	rc, _ := m.SyscallConn()
	var n uint32
	var ierr error
	rc.Control(func(fd uintptr) {
		if ierr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ierr == nil {
			n, ierr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
		}
	})
	if ierr != nil {
		t.Fatal(ierr)
	}
	if err := makeRaw(m); err != nil { // the host end of a careful setup is raw too
		t.Fatal(err)
	}
	return m, fmt.Sprintf("/dev/pts/%d", n)
}

func TestStreamRefusedWithoutHostOnly(t *testing.T) {
	_, slave := openPty(t)
	s := Stream{Path: slave}
	if _, err := s.Listen(testCtx(t)); !errors.Is(err, ErrNotHostOnly) {
		t.Fatalf("Listen err = %v, want ErrNotHostOnly", err)
	}
	if _, err := s.Dial(testCtx(t)); !errors.Is(err, ErrNotHostOnly) {
		t.Fatalf("Dial err = %v, want ErrNotHostOnly", err)
	}
}

func TestStreamRefusesNonDevice(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o600)
	for _, p := range []string{file, t.TempDir()} {
		if _, err := (Stream{Path: p, HostOnly: true}).Listen(testCtx(t)); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", p, err)
		}
	}
}

// Every byte value crosses the stream unchanged in both directions: the
// tty is raw (no CR/LF mapping, no ^C, no XON/XOFF, no echo).
func TestStreamPtyIsEightBitClean(t *testing.T) {
	master, slave := openPty(t)
	l, err := Stream{Path: slave, HostOnly: true, PollInterval: 10 * time.Millisecond}.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	accepted := make(chan io.ReadWriteCloser, 1)
	go func() {
		c, err := l.Accept(testCtx(t))
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	master.Write([]byte("\n")) // the first byte opens the connection
	c := <-accepted
	if c == nil {
		t.FailNow()
	}
	defer c.Close()
	if _, err := master.Write(all); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1)
	if _, err := io.ReadFull(c, got); err != nil || got[0] != '\n' {
		t.Fatalf("first byte %q %v", got, err)
	}
	got = make([]byte, 256)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, all) {
		t.Fatalf("guest side read %v (err %v), want every byte value in order", got, err)
	}
	if _, err := c.Write(all); err != nil {
		t.Fatal(err)
	}
	master.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(master, got); err != nil || !bytes.Equal(got, all) {
		t.Fatalf("host side read %v (err %v)", got, err)
	}
}

// Accept waits for a peer without returning, obeys ctx and Close, and
// hands out one connection at a time.
func TestStreamAcceptWaitsAndObeysCtx(t *testing.T) {
	master, slave := openPty(t)
	l, err := Stream{Path: slave, HostOnly: true, PollInterval: 10 * time.Millisecond}.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept with no peer: %v, want DeadlineExceeded", err)
	}
	master.Write([]byte("a"))
	c, err := l.Accept(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	if _, err := l.Accept(ctx2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Accept while the first connection is open: %v, want DeadlineExceeded", err)
	}
	c.Close()
	closed := make(chan error, 1)
	go func() {
		_, err := l.Accept(testCtx(t))
		closed <- err
	}()
	time.Sleep(50 * time.Millisecond)
	l.Close()
	if err := <-closed; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// The device the transport opens is in raw mode, whatever it was before.
func TestStreamOpenMakesTTYRaw(t *testing.T) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rc, _ := m.SyscallConn()
	var n uint32
	rc.Control(func(fd uintptr) {
		unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0)
		n, _ = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
	})
	f, err := openStream(fmt.Sprintf("/dev/pts/%d", n)) // a fresh pty: cooked
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var tio *unix.Termios
	rc, _ = f.SyscallConn()
	rc.Control(func(fd uintptr) { tio, err = unix.IoctlGetTermios(int(fd), unix.TCGETS) })
	if err != nil {
		t.Fatal(err)
	}
	if tio.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG|unix.IEXTEN) != 0 || tio.Oflag&unix.OPOST != 0 ||
		tio.Iflag&(unix.ICRNL|unix.IXON|unix.ISTRIP|unix.INLCR) != 0 || tio.Cflag&unix.CSIZE != unix.CS8 {
		t.Fatalf("termios not raw: %+v", tio)
	}
}
