package vmguest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/computer/vm/muxlink"
)

// The guest's side of egress. The guest has no network device: a
// program reaches the host's egress proxy by connecting to the listener
// the host asks for (ctl egress) on the guest's loopback, and the agent
// dials one wire stream to the host for each connection there
// (muxlink's guest dials). The host serves the streams only while it
// listens, and bounds them; the agent trusts nothing the program sends
// and adds nothing: the bytes go to the proxy as they came.

// egressBridge is the listener the host asked for, if any.
type egressBridge struct {
	mu   sync.Mutex
	port int
	ln   net.Listener
}

// acceptPause is how long the bridge waits after a failed Accept that is
// not the listener's close (out of descriptors, say).
const acceptPause = 50 * time.Millisecond

// startEgress listens on 127.0.0.1:port in the guest and bridges each
// connection to a stream it dials over the wire link. Asking again for
// the same port does nothing; a second port is refused.
func (a *agent) startEgress(port int) error {
	if a.link == nil {
		return errors.New("egress: the guest has no wire link")
	}
	a.egress.mu.Lock()
	defer a.egress.mu.Unlock()
	switch {
	case a.egress.ln != nil && a.egress.port == port:
		return nil
	case a.egress.ln != nil:
		return fmt.Errorf("egress: listening on port %d already", a.egress.port)
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	a.egress.ln, a.egress.port = ln, port
	go serveEgress(ln, a.link, a.sup.log)
	return nil
}

// serveEgress bridges every connection ln accepts, for the life of the
// guest.
func serveEgress(ln net.Listener, link *muxlink.Link, log *logSink) {
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			log.note("egress: accept: %v", err)
			time.Sleep(acceptPause)
			continue
		}
		go bridgeEgress(c, link)
	}
}

// bridgeEgress joins c to a new stream to the host; when the link takes
// no more streams (muxlink.MaxGuestStreams) c is closed at once.
func bridgeEgress(c net.Conn, link *muxlink.Link) {
	s, err := link.Dial()
	if err != nil {
		c.Close()
		return
	}
	muxlink.Join(c, s)
}

// makeRefusalDir makes dir (root's, 0755) for the refusal log.
func makeRefusalDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("refusal log: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		return fmt.Errorf("refusal log: %w", err)
	}
	return nil
}

// appendRefusal appends line (checked by ctl: one line, bounded) to
// the refusal log in dir, first renaming it to its ".1" when the line
// would take it past ctl.MaxRefusalLogBytes. Only root writes in dir,
// and the file is opened without following a symlink.
func appendRefusal(dir string, line []byte) error {
	if err := makeRefusalDir(dir); err != nil {
		return err
	}
	name := filepath.Join(dir, filepath.Base(ctl.RefusalLog))
	var st unix.Stat_t
	err := unix.Lstat(name, &st)
	switch {
	case err == nil && st.Size+int64(len(line)) > ctl.MaxRefusalLogBytes:
		if err := os.Rename(name, name+".1"); err != nil {
			return fmt.Errorf("refusal log: rotate: %w", err)
		}
	case err != nil && !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("refusal log: %w", err)
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("refusal log: %w", err)
	}
	defer f.Close()
	if err := f.Chmod(0o644); err != nil { // readable by the commands, whatever the umask
		return fmt.Errorf("refusal log: %w", err)
	}
	if _, err := f.Write(line); err != nil {
		return fmt.Errorf("refusal log: %w", err)
	}
	return nil
}
