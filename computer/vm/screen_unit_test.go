package vm

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/token"
)

// TestClipLabel: a label for any caller fits the token store's bound,
// whole runes, printable only; a short one is kept as it is.
func TestClipLabel(t *testing.T) {
	if got := clipLabel("control link for owner alice"); got != "control link for owner alice" {
		t.Fatalf("short label changed: %q", got)
	}
	long := "view link for admin " + strings.Repeat("é", 60) + "\n\x00"
	got := clipLabel(long)
	if len(got) > token.MaxLabel || !utf8.ValidString(got) || strings.ContainsAny(got, "\n\x00") || !strings.HasPrefix(got, "view link for admin é") {
		t.Fatalf("clipLabel(%q) = %q (%d bytes)", long, got, len(got))
	}
}

// TestScreenRefusesAForeignQMPSocket is the attack test of the view's
// pins: a socket at the view's QMP path that is not QEMU's uid's is
// refused before any connection (ErrSocketOwner), and nothing connects
// to it. Positive control: the same socket, when its owner is the uid
// the machine says is QEMU's, is connected to (and, speaking no QMP,
// fails later).
func TestScreenRefusesAForeignQMPSocket(t *testing.T) {
	dir := t.TempDir()
	m := &Machine{p: &Provisioner{}, paths: layout(dir)}
	if err := os.Mkdir(m.paths.qemu, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", m.paths.viewQMP)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(m.paths.viewQMP, 0o600); err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	got := make(chan struct{}, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
			got <- struct{}{}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.qemuUID = uint32(os.Geteuid()) + 1
	if err := m.startScreen(ctx); !errors.Is(err, qmpinput.ErrSocketOwner) {
		t.Fatalf("a view QMP socket of another uid: %v, want ErrSocketOwner", err)
	}
	m.qemuUID = uint32(os.Geteuid())
	if err := m.startScreen(ctx); err == nil || errors.Is(err, qmpinput.ErrSocketOwner) {
		t.Fatalf("positive control: %v, want a failure past the pins", err)
	}
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("positive control: nothing connected to the socket")
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d connections, want the positive control's one", n)
	}
	if m.liveScreen() != nil {
		t.Fatal("a failed start left a screen")
	}
}
