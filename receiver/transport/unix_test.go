package transport

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func socketPath(t *testing.T) string {
	dir := t.TempDir() // 0700, owned by this user
	return filepath.Join(dir, "receiver.sock")
}

// Without HostOnly, both ends refuse: nothing is created or dialled.
func TestUnixRefusedWithoutHostOnly(t *testing.T) {
	path := socketPath(t)
	u := Unix{Path: path}
	if _, err := u.Listen(testCtx(t)); !errors.Is(err, ErrNotHostOnly) {
		t.Fatalf("Listen err = %v, want ErrNotHostOnly", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("refused Listen left %s behind", path)
	}
	if _, err := u.Dial(testCtx(t)); !errors.Is(err, ErrNotHostOnly) {
		t.Fatalf("Dial err = %v, want ErrNotHostOnly", err)
	}
}

func TestUnixRoundTripAndMode(t *testing.T) {
	u := Unix{Path: socketPath(t), HostOnly: true}
	old := syscall.Umask(0) // the socket's mode must not depend on it
	defer syscall.Umask(old)
	l, err := u.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(u.Path)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v mode %v, want a 0600 socket", err, fi.Mode())
	}
	accepted := make(chan io.ReadWriteCloser, 1)
	go func() {
		c, err := l.Accept(testCtx(t))
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	c, err := u.Dial(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q %v", buf, err)
	}
	c.Close()
	s.Close()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Lstat(u.Path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("Close left the socket file")
	}
}

func TestUnixAcceptObeysCtx(t *testing.T) {
	l, err := Unix{Path: socketPath(t), HostOnly: true}.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept err = %v, want DeadlineExceeded", err)
	}
	// The listener still works after a cancelled Accept.
	go func() {
		c, err := Unix{Path: l.Addr()[len("unix:"):], HostOnly: true}.Dial(testCtx(t))
		if err == nil {
			defer c.Close()
			c.Write([]byte("x"))
		}
	}()
	c, err := l.Accept(testCtx(t))
	if err != nil {
		t.Fatalf("Accept after a cancelled one: %v", err)
	}
	c.Close()
}

// Listen never clobbers what is not a stale socket, and refuses a socket
// directory others could write.
func TestUnixListenRefusesUnsafePaths(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("keep"), 0o600)
	if _, err := (Unix{Path: file, HostOnly: true}).Listen(testCtx(t)); !errors.Is(err, ErrConfig) {
		t.Errorf("regular file: %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Error("Listen touched a regular file")
	}
	live, err := Unix{Path: filepath.Join(dir, "live.sock"), HostOnly: true}.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if _, err := (Unix{Path: filepath.Join(dir, "live.sock"), HostOnly: true}).Listen(testCtx(t)); !errors.Is(err, ErrConfig) {
		t.Errorf("live socket: %v", err)
	}
	// A stale socket (bound, nobody listening) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	fd, _ := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	syscall.Bind(fd, &syscall.SockaddrUnix{Name: stale})
	syscall.Close(fd)
	l, err := Unix{Path: stale, HostOnly: true}.Listen(testCtx(t))
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	l.Close()
	open := filepath.Join(t.TempDir(), "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if _, err := (Unix{Path: filepath.Join(open, "s.sock"), HostOnly: true}).Listen(testCtx(t)); !errors.Is(err, ErrConfig) {
		t.Errorf("world-writable dir: %v", err)
	}
	if _, err := (Unix{Path: "rel.sock", HostOnly: true}).Listen(testCtx(t)); !errors.Is(err, ErrConfig) {
		t.Errorf("relative path: %v", err)
	}
}

// TestIntegrationUnixPeerUID attacks the uid check: a process running as
// an unprivileged uid (as a receiver child would) connects to the socket
// (made world-connectable for the attack) and is refused inside Accept;
// the listener stays up and serves the next, allowed peer.
func TestIntegrationUnixPeerUID(t *testing.T) {
	testenv.Require(t, "root")
	dir, err := os.MkdirTemp("", "tether-unix-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o711) // others may traverse, not write
	u := Unix{Path: filepath.Join(dir, "r.sock"), HostOnly: true, Mode: 0o666}
	l, err := u.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan io.ReadWriteCloser, 1)
	go func() {
		c, err := l.Accept(testCtx(t))
		if err == nil {
			accepted <- c
		}
	}()
	// The attacker: uid 60123 writes one byte and waits for the close.
	cmd := exec.Command(helperBinary(t))
	cmd.Env = append(os.Environ(), "TETHER_HELPER_SOCKET="+u.Path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 60123, Gid: 60123}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("attacker helper: %v\n%s", err, out)
	}
	if string(out) != "refused\n" {
		t.Fatalf("attacker saw %q, want its connection closed", out)
	}
	select {
	case c := <-accepted:
		t.Fatalf("Accept returned the uid 60123 peer %v", c)
	case <-time.After(100 * time.Millisecond):
	}
	c, err := u.Dial(testCtx(t)) // root: allowed
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	(<-accepted).Close()
	// And the dialling side checks the listener: a socket served by uid
	// 60123 is refused when only root is expected.
	if err := dialAsCheck(t, dir); err != nil {
		t.Fatal(err)
	}
}

// dialAsCheck makes a listener owned by uid 60124 and checks that Dial,
// expecting root only, refuses it with a *PeerError.
func dialAsCheck(t *testing.T, dir string) error {
	path := filepath.Join(dir, "evil.sock")
	cmd := exec.Command(helperBinary(t))
	cmd.Env = append(os.Environ(), "TETHER_HELPER_LISTEN="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 60124, Gid: 60124}}
	stdout, _ := cmd.StdoutPipe()
	os.Chmod(dir, 0o733) // let the helper create its socket
	defer os.Chmod(dir, 0o711)
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ready := make([]byte, 6)
	if _, err := io.ReadFull(stdout, ready); err != nil {
		return err
	}
	_, err := Unix{Path: path, HostOnly: true, PeerUIDs: []uint32{0}}.Dial(testCtx(t))
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != "60124" {
		t.Errorf("Dial to a uid 60124 listener: err = %v, want PeerError naming 60124", err)
	}
	return nil
}

// TestMain doubles as the helper processes of the uid tests: the test
// binary re-runs itself under another uid with one of these variables set.
func TestMain(m *testing.M) {
	switch {
	case os.Getenv("TETHER_HELPER_SOCKET") != "":
		helperUnixPeer(os.Getenv("TETHER_HELPER_SOCKET"))
	case os.Getenv("TETHER_HELPER_LISTEN") != "":
		helperUnixListen(os.Getenv("TETHER_HELPER_LISTEN"))
	}
	os.Exit(m.Run())
}

// helperUnixPeer is the attacker process of TestIntegrationUnixPeerUID.
func helperUnixPeer(path string) {
	c, err := net.Dial("unix", path)
	if err != nil {
		os.Stdout.WriteString("dial: " + err.Error() + "\n")
		os.Exit(0)
	}
	c.Write([]byte("x"))
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := c.Read(make([]byte, 1))
	switch {
	case n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
		os.Stdout.WriteString("refused\n")
	case err != nil:
		os.Stdout.WriteString("not closed: " + err.Error() + "\n")
	default:
		os.Stdout.WriteString("served " + strconv.Itoa(n) + "\n")
	}
	os.Exit(0)
}

// helperUnixListen is the impostor listener of dialAsCheck.
func helperUnixListen(path string) {
	l, err := net.Listen("unix", path)
	if err != nil {
		os.Stdout.WriteString("error\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("ready\n")
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(0)
		}
		defer c.Close()
	}
}

// helperBinary copies the test binary where an unprivileged uid can run it
// (go test's build directory is private to root).
func helperBinary(t *testing.T) string {
	dir, err := os.MkdirTemp("", "tether-helper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestUnixLongPath: a socket path longer than a sockaddr_un holds is
// bound and dialled through its directory's descriptor, for the plain
// unix transport and for TLS over it.
func TestUnixLongPath(t *testing.T) {
	dir := t.TempDir()
	for len(dir) < 120 {
		dir = filepath.Join(dir, "a-rather-long-directory-name")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "receiver.sock")
	u := Unix{Path: path, HostOnly: true}
	l, err := u.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(testCtx(t)); err == nil {
			c.Write([]byte("x"))
			c.Close()
		}
	}()
	c, err := u.Dial(testCtx(t))
	if err != nil {
		t.Fatalf("dial %d-byte path: %v", len(path), err)
	}
	defer c.Close()
	if b, err := io.ReadAll(c); err != nil || string(b) != "x" {
		t.Fatalf("read %q %v", b, err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket at the long path: %v %v", fi, err)
	}
	w := newTLSWorld(t)
	tl := listenTLS(t, w.unixServer(filepath.Join(dir, "tls.sock"), w.server))
	if err := exchange(t, tl, w.unixClient(filepath.Join(dir, "tls.sock"), w.client)); err != nil {
		t.Fatalf("TLS over a long unix path: %v", err)
	}
}
