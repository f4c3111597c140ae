package spawn

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/caps"
)

// TestOnCallingThread: with OnCallingThread the child is forked from the
// caller's own thread, which Start locks and restricts (the caller sees
// CapBnd 0 and NoNewPrivs on its thread afterwards), while the child's
// masks are exactly those of a normal start; once the caller's goroutine
// ends, that thread is gone, and the child with it if still running
// (parent-death signal), and no thread of the process is left tainted.
func TestOnCallingThread(t *testing.T) {
	testenv.Require(t, "root")
	want, err := caps.ReadStatus("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := workDir(t)
	type result struct {
		c      *Child
		out    chan []byte
		thread caps.Status
		err    error
	}
	startHere := func(keep bool, argv ...string) result {
		res := make(chan result, 1)
		go func() { // the "request goroutine": it ends once its child is reaped (keep), or right away
			r, w, _ := os.Pipe()
			c, err := Start(Spec{Mode: ModeThread, Path: argv[0], Argv: argv, Env: []string{}, Dir: dir,
				Output: w, UID: uid, GID: gid, Groups: groups, OnCallingThread: true})
			w.Close()
			st, serr := caps.ReadStatus("/proc/thread-self/status")
			out := make(chan []byte, 1)
			go func() { b, _ := readAll(r); out <- b }()
			res <- result{c: c, out: out, thread: st, err: errorsJoin(err, serr)}
			if keep && c != nil {
				<-c.Done()
			}
		}()
		return <-res
	}
	r := startHere(true, "/bin/sh", "-c", "cat /proc/self/status; echo @@@; /bin/sh -c 'cat /proc/self/status'")
	if r.err != nil {
		t.Fatal(r.err)
	}
	<-r.c.Done()
	parts := strings.Split(string(<-r.out), "@@@\n")
	if len(parts) != 2 || r.c.Status() != (Status{Code: 0}) {
		t.Fatalf("status %+v, output %q", r.c.Status(), parts)
	}
	for i, p := range parts {
		assertUnprivileged(t, []string{"child", "grandchild"}[i], p)
	}
	if r.thread.CapBnd != 0 || r.thread.NoNewPrivs != 1 {
		t.Fatalf("the calling thread was not the spawning thread: CapBnd %016x NoNewPrivs %d", r.thread.CapBnd, r.thread.NoNewPrivs)
	}
	// The caller's goroutine ended at once (no wait for its child): the
	// thread's exit is the parent-death signal of a still running child.
	r = startHere(false, "/bin/sleep", "100")
	if r.err != nil {
		t.Fatal(r.err)
	}
	select {
	case <-r.c.Done():
	case <-time.After(30 * time.Second):
		r.c.Kill()
		t.Fatal("the child outlived the thread it was forked from")
	}
	if st := r.c.Status(); st.Signal != syscall.SIGKILL {
		t.Fatalf("status %+v, want SIGKILL from the parent-death signal", st)
	}
	deadline := time.Now().Add(30 * time.Second) // thread exits are asynchronous; a bound for a slow guest
	for bad := differentThreads(t, want); len(bad) > 0; bad = differentThreads(t, want) {
		if time.Now().After(deadline) {
			t.Fatalf("tainted threads left after the callers ended:\n%s", strings.Join(bad, "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReap: every caller of Reap returns once the child is reaped, with
// its status, whether Reap, the reaper or both reaped it; a group member
// left behind is killed first, as the reaper does.
func TestReap(t *testing.T) {
	testenv.Require(t, "root")
	waitNoUID(t, uid)
	dir, _ := workDir(t)
	for i := range 20 {
		c, out, err := start(ModeThread, dir, nil, nil, "/bin/sh", "-c", "sleep 100 & exit 4")
		if err != nil {
			t.Fatal(err)
		}
		if c.pidfd == nil {
			t.Fatal("no pidfd: Reap would only wait for the reaper")
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(c.Reap)
		}
		wg.Wait()
		select {
		case <-c.Done():
		default:
			t.Fatalf("cycle %d: Reap returned before Done", i)
		}
		if st := c.Status(); st != (Status{Code: 4}) {
			t.Fatalf("cycle %d: status %+v, want exit 4", i, st)
		}
		<-out
	}
	deadline := time.Now().Add(30 * time.Second) // the sleepers die of SIGKILL and are reaped as orphans
	for countUID(t, uid) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if left := procsOfUID(t, uid); len(left) > 0 {
		t.Fatalf("processes %v left in reaped groups", left)
	}
}

func readAll(f *os.File) ([]byte, error) {
	defer f.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return []byte(b.String()), nil
		}
	}
}

func errorsJoin(errs ...error) error {
	var msgs []string
	for _, e := range errs {
		if e != nil {
			msgs = append(msgs, e.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}
