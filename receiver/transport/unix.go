package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/receiver/internal/ratelog"
)

// Unix is a unix stream socket. It has no cryptographic peer
// authentication, so HostOnly must be set. Each side checks the other's
// uid with SO_PEERCRED against PeerUIDs.
type Unix struct {
	// Path is the socket's absolute path. Listen refuses a directory that
	// group or others may write (a peer could swap the socket), replaces a
	// stale socket nobody listens on, and never removes anything else.
	Path string
	// HostOnly declares that only the host can reach Path. Required.
	HostOnly bool
	// Mode is the socket file's mode on Listen; 0 means 0600. It is set
	// before the socket listens, so it never depends on the umask.
	Mode fs.FileMode
	// PeerUIDs lists the uids the peer may run as; empty means root and
	// this process's effective uid.
	PeerUIDs []uint32
	// Log receives refused peers on Listen; nil discards.
	Log *slog.Logger
}

var _ Transport = Unix{}

func (u Unix) String() string { return "unix:" + u.Path }

func (u Unix) check() error {
	if err := requireHostOnly("unix socket", u.HostOnly); err != nil {
		return err
	}
	if !filepath.IsAbs(u.Path) || filepath.Clean(u.Path) != u.Path {
		return fmt.Errorf("%w: unix path %q is not absolute and clean", ErrConfig, u.Path)
	}
	if u.Mode&^0o777 != 0 {
		return fmt.Errorf("%w: unix socket mode %#o has bits beyond 0777", ErrConfig, u.Mode)
	}
	return nil
}

func (u Unix) allowed() []uint32 {
	if len(u.PeerUIDs) > 0 {
		return u.PeerUIDs
	}
	return []uint32{0, uint32(os.Geteuid())}
}

// Dial connects to the socket and checks the listener's uid.
func (u Unix) Dial(ctx context.Context) (io.ReadWriteCloser, error) {
	if err := u.check(); err != nil {
		return nil, err
	}
	c, err := dialUnixPath(ctx, u.Path)
	if err != nil {
		return nil, fmt.Errorf("transport: dial unix %s: %w", u.Path, err)
	}
	uc := c.(*net.UnixConn)
	if err := checkPeerUID(uc, u.allowed()); err != nil {
		_ = uc.Close()
		return nil, fmt.Errorf("transport: dial unix %s: %w", u.Path, err)
	}
	return uc, nil
}

// Listen binds and listens on Path with Mode.
func (u Unix) Listen(ctx context.Context) (Listener, error) {
	if err := u.check(); err != nil {
		return nil, err
	}
	if err := checkSocketDir(filepath.Dir(u.Path)); err != nil {
		return nil, err
	}
	if err := removeStale(ctx, u.Path); err != nil {
		return nil, err
	}
	mode := u.Mode
	if mode == 0 {
		mode = 0o600
	}
	ln, ino, err := bindUnix(u.Path, mode)
	if err != nil {
		return nil, err
	}
	log := u.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &unixListener{ln: ln, path: u.Path, ino: ino, uids: u.allowed(),
		refused: ratelog.New(log, "transport: unix peer refused", 0)}, nil
}

// checkSocketDir refuses a directory that group or others may write, or
// that neither root nor this process's user owns: whoever may write it can
// replace the socket.
func checkSocketDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("transport: unix socket directory %s: %w", dir, err)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: unix socket directory %s is writable by group or others (mode %#o)",
			ErrConfig, dir, st.Mode&0o777)
	}
	if st.Uid != 0 && st.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("%w: unix socket directory %s is owned by uid %d, not root or this user",
			ErrConfig, dir, st.Uid)
	}
	return nil
}

// removeStale removes a socket at path that nobody listens on. Anything
// else at path (a live socket, a file, a symlink) is refused.
func removeStale(ctx context.Context, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("transport: unix listen: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%w: %s exists and is not a socket", ErrConfig, path)
	}
	c, err := dialUnixPath(ctx, path)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("%w: %s: another process is listening", ErrConfig, path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("transport: unix listen: probe %s: %w", path, err)
	}
	return os.Remove(path)
}

// bindUnix binds, sets the mode, then listens, so no peer can connect
// while the socket has its umask-derived mode. It returns the listener and
// the socket's inode (Close removes the path only if it is still ours).
func bindUnix(path string, mode fs.FileMode) (*net.UnixListener, uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("transport: unix socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	name, release, err := sockName(path)
	if err != nil {
		return nil, 0, fmt.Errorf("transport: bind %s: %w", path, err)
	}
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: name})
	release()
	if err != nil {
		return nil, 0, fmt.Errorf("transport: bind %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, 0, fmt.Errorf("transport: %s changed after bind: %v", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		_ = os.Remove(path)
		return nil, 0, fmt.Errorf("transport: chmod %s: %w", path, err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		_ = os.Remove(path)
		return nil, 0, fmt.Errorf("transport: listen %s: %w", path, err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		_ = os.Remove(path)
		return nil, 0, fmt.Errorf("transport: listen %s: %w", path, err)
	}
	return ln.(*net.UnixListener), st.Ino, nil
}

type unixListener struct {
	ln      *net.UnixListener
	path    string
	ino     uint64
	uids    []uint32
	refused *ratelog.Log // refused peers, aggregated
	once    sync.Once
}

func (l *unixListener) Addr() string { return "unix:" + l.path }

// Accept returns the next peer whose uid is allowed.
func (l *unixListener) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	for {
		var c *net.UnixConn
		err := withCtx(ctx, l.ln, func() (err error) {
			c, err = l.ln.AcceptUnix()
			return err
		})
		if err != nil {
			return nil, err
		}
		if err := checkPeerUID(c, l.uids); err != nil {
			l.refused.Refused("peer uid", l.path, err)
			_ = c.Close()
			continue
		}
		return c, nil
	}
}

// Close stops listening, removes the socket file if it is still the one
// this listener created, and logs the refusals still counted.
func (l *unixListener) Close() error {
	var err error
	l.once.Do(func() {
		defer l.refused.Close()
		err = l.ln.Close()
		var st unix.Stat_t
		if unix.Lstat(l.path, &st) == nil && st.Ino == l.ino && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
			_ = os.Remove(l.path)
		}
	})
	return err
}

// checkPeerUID reads the peer's credentials (SO_PEERCRED) and checks the
// uid against allowed.
func checkPeerUID(c *net.UnixConn, allowed []uint32) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("transport: SO_PEERCRED: %w", cerr)
	}
	if !slices.Contains(allowed, cred.Uid) {
		return &PeerError{Check: "peer uid", Peer: strconv.FormatUint(uint64(cred.Uid), 10),
			Want: fmt.Sprint(allowed)}
	}
	return nil
}

// maxSockName is the longest path a sockaddr_un holds with its NUL.
const maxSockName = 107

// sockName returns the name to bind or connect to for the socket at
// path: path itself, or, when it is longer than a sockaddr_un holds,
// /proc/self/fd/N/BASE through an O_PATH descriptor of its directory,
// which release closes once the bind or connect is done.
func sockName(path string) (string, func(), error) {
	if len(path) <= maxSockName {
		return path, func() {}, nil
	}
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	name := "/proc/self/fd/" + strconv.Itoa(dir) + "/" + filepath.Base(path)
	if len(name) > maxSockName {
		unix.Close(dir)
		return "", nil, fmt.Errorf("%w: unix socket name %q is too long", ErrConfig, filepath.Base(path))
	}
	return name, func() { unix.Close(dir) }, nil
}

// dialUnixPath connects to the socket at path, however long.
func dialUnixPath(ctx context.Context, path string) (net.Conn, error) {
	name, release, err := sockName(path)
	if err != nil {
		return nil, err
	}
	defer release()
	var d net.Dialer
	return d.DialContext(ctx, "unix", name)
}
