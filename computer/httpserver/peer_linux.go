package httpserver

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/computer/api"
)

// admit returns the caller for peer credentials, or false.
func (p PeerPolicy) admit(uc *unix.Ucred) (api.Caller, bool) {
	owner := "uid:" + strconv.FormatUint(uint64(uc.Uid), 10)
	if uc.Uid == 0 {
		return api.Caller{Owner: owner, Admin: true}, true
	}
	if p.Group == nil {
		return api.Caller{}, false
	}
	if uc.Gid == *p.Group {
		return api.Caller{Owner: owner}, true
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(uc.Uid), 10))
	if err != nil {
		return api.Caller{}, false
	}
	gids, err := u.GroupIds()
	if err != nil {
		return api.Caller{}, false
	}
	want := strconv.FormatUint(uint64(*p.Group), 10)
	for _, g := range gids {
		if g == want {
			return api.Caller{Owner: owner}, true
		}
	}
	return api.Caller{}, false
}

// ListenUnix listens on a new unix socket at path (an existing socket
// file there is removed first), made mode 0660 and group policy.Group so
// the file system admits the same peers. audit receives every refusal;
// nil logs nothing. The caller closes the listener.
func ListenUnix(path string, policy PeerPolicy, audit func(AuditRecord)) (*PeerListener, error) {
	if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on unix socket: %w", err)
	}
	gid := -1
	if policy.Group != nil {
		gid = int(*policy.Group)
	}
	if err := os.Chown(path, -1, gid); err != nil {
		l.Close()
		return nil, fmt.Errorf("chown socket: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	if audit == nil {
		audit = func(AuditRecord) {}
	}
	return &PeerListener{UnixListener: l, policy: policy, audit: audit}, nil
}

// Accept returns the next admitted connection.
func (l *PeerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		uc, err := peerCred(c)
		if err != nil {
			c.Close()
			l.audit(AuditRecord{Time: time.Now(), Who: "unknown", Action: AuditPeerRefused, Outcome: err.Error()})
			continue
		}
		if caller, ok := l.policy.admit(uc); ok {
			return &PeerConn{Conn: c, Caller: caller}, nil
		}
		c.Close()
		l.audit(AuditRecord{Time: time.Now(), Who: fmt.Sprintf("uid:%d gid:%d pid:%d", uc.Uid, uc.Gid, uc.Pid),
			Action: AuditPeerRefused, Outcome: "neither root nor in the group"})
	}
}

// peerCred reads c's SO_PEERCRED.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var uc *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		uc, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	if uc == nil {
		return nil, errors.New("SO_PEERCRED: no credentials")
	}
	return uc, nil
}
