package conformance

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/pki"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wireserver"
)

func TestUnix(t *testing.T) { Run(t, unixSetup) }

func TestTLS(t *testing.T) { Run(t, tlsSetup) }

// TestStreamPty runs the suite over a real pty pair: the receiver listens
// on the slave (as on a guest's virtio-serial port), the client drives the
// master (the host's end).
func TestStreamPty(t *testing.T) { Run(t, ptySetup) }

func listen(t testing.TB, tr transport.Transport) transport.Listener {
	t.Helper()
	l, err := tr.Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func unixSetup(t testing.TB) (wireserver.Listener, Dial) {
	tr := transport.Unix{Path: filepath.Join(t.TempDir(), "r.sock"), HostOnly: true}
	return listen(t, tr), tr.Dial
}

func tlsSetup(t testing.TB) (wireserver.Listener, Dial) {
	ca, err := pki.NewCA("conformance CA")
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := ca.Server("receiver.test")
	cli, _ := ca.Client("custodian")
	l := listen(t, transport.TLS{Address: "127.0.0.1:0", CA: ca.Cert, Certificate: srv.TLSCertificate()})
	d := transport.TLS{Address: l.Addr(), CA: ca.Cert, CASPKISHA256: ca.SPKISHA256(),
		Certificate: cli.TLSCertificate(), ServerName: "receiver.test"}
	return l, d.Dial
}

func ptySetup(t testing.TB) (wireserver.Listener, Dial) {
	master, slave := openPty(t)
	l := listen(t, transport.Stream{Path: slave, HostOnly: true, PollInterval: 5 * time.Millisecond})
	used := false // the master is already open: dialling hands it out once
	return l, func(ctx context.Context) (io.ReadWriteCloser, error) {
		if used {
			return nil, fmt.Errorf("the pty's host end was already handed out")
		}
		used = true
		return master, nil
	}
}

// openPty opens a pty pair; the master is raw, as a careful host sets its
// end of a serial line.
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
		if ierr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ierr != nil {
			return
		}
		if n, ierr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN); ierr != nil {
			return
		}
		var tio *unix.Termios
		if tio, ierr = unix.IoctlGetTermios(int(fd), unix.TCGETS); ierr != nil {
			return
		}
		tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
		tio.Oflag &^= unix.OPOST
		tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		tio.Cflag = tio.Cflag&^(unix.CSIZE|unix.PARENB) | unix.CS8
		ierr = unix.IoctlSetTermios(int(fd), unix.TCSETS, tio)
	})
	if ierr != nil {
		t.Fatal(ierr)
	}
	return m, fmt.Sprintf("/dev/pts/%d", n)
}
