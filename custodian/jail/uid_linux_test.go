package jail

import (
	"errors"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/admission/idfiles"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestDrawUIDSkipsHeldAndUsedIDs: each of drawUID's two checks keeps a
// jail off a uid on its own. TestIntegrationJailOwnUID's two live jails
// differ through either (the first jail's agent already runs as its uid
// when the second draws), so it passes with one of them gone; here each
// is alone. Over a range of one free id, a draw while a lease holds that
// id's lock is refused (ErrUID), and so is a draw while a process runs as
// the id and no lock is held. Positive controls: with the lease released,
// and with the process ended, the same draw gets the id.
func TestDrawUIDSkipsHeldAndUsedIDs(t *testing.T) {
	testenv.Require(t, "root")
	dir := filepath.Join(t.TempDir(), "locks")
	if err := checkLockDir(dir); err != nil {
		t.Fatal(err)
	}
	id := unusedID(t)
	r := IDRange{First: id, Last: id}

	held, err := drawUID(dir, r)
	if err != nil || held.uid != id {
		t.Fatalf("the first draw of %d..%d: %+v, %v", id, id, held, err)
	}
	if l, err := drawUID(dir, r); !errors.Is(err, ErrUID) {
		l.release()
		t.Fatalf("a draw while another lease holds uid %d: %+v, %v; want ErrUID", id, l, err)
	}
	held.release()
	l, err := drawUID(dir, r)
	if err != nil || l.uid != id {
		t.Fatalf("control: a draw after the lease of uid %d ended: %+v, %v", id, l, err)
	}
	l.release()

	// exec.Cmd.Start returns once the child has exec'd, so it already
	// runs as id when the draw lists the processes.
	sleeper := exec.Command("sleep", "300")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id}, Pdeathsig: syscall.SIGKILL}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	if l, err := drawUID(dir, r); !errors.Is(err, ErrUID) {
		l.release()
		t.Fatalf("a draw while a process runs as uid %d (no lock held): %+v, %v; want ErrUID", id, l, err)
	}
	sleeper.Process.Kill()
	sleeper.Wait() // reaped: gone from /proc
	l, err = drawUID(dir, r)
	if err != nil || l.uid != id {
		t.Fatalf("control: a draw after the process of uid %d ended: %+v, %v", id, l, err)
	}
	l.release()
}

// unusedID is an id below the jail's default range that /etc/passwd and
// /etc/group do not name and no process uses.
func unusedID(t *testing.T) uint32 {
	t.Helper()
	named := map[uint32]bool{}
	if err := idfiles.Named(named, "/etc/passwd", 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := idfiles.Named(named, "/etc/group", 2); err != nil {
		t.Fatal(err)
	}
	used, err := processIDs()
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		id := 40000 + rand.Uint32N(10000)
		if !named[id] && !used[id] {
			return id
		}
	}
	t.Fatal("no unused id in 40000-49999")
	return 0
}
