package signedfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission"
)

// clock is a settable test clock.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock { c := &clock{}; c.ns.Store(t.UnixNano()); return c }
func (c *clock) Now() time.Time   { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Set(t time.Time)  { c.ns.Store(t.UnixNano()) }

type refresherFixture struct {
	dir string
	pub *Publisher
	r   *Refresher
	clk *clock
}

func newRefresherFixture(t testing.TB, opts RefresherOptions) *refresherFixture {
	t.Helper()
	dir, k := adminDir(t), testKey(t)
	clk := newClock(t0)
	l := newTestLoader(t, dir, k.Public(), clk.Now)
	r, err := NewRefresher(context.Background(), l, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &refresherFixture{dir: dir, pub: newTestPublisher(t, dir, k, clk.Now), r: r, clk: clk}
}

func (f *refresherFixture) lookup(tu admission.Tuple, op admission.Op) (admission.Grant, uint64, error) {
	return f.r.Lookup(context.Background(), tu.SHA256(), op)
}

func TestRefresherLookupErrors(t *testing.T) {
	f := newRefresherFixture(t, RefresherOptions{NoWatch: true})
	if _, _, err := f.lookup(tupleN(1), admission.OpRead); !errors.Is(err, ErrFileMissing) || !errors.Is(err, ErrUntrusted) {
		t.Fatalf("before any publish: err = %v, want ErrFileMissing", err)
	}
	na := t0.Add(time.Hour)
	mustPublish(t, f.pub, inputWith(0, na,
		grantFor(tupleN(1), na, admission.OpRead, admission.OpList),
		grantFor(tupleN(2), t0.Add(time.Minute))))
	g, gen, err := f.lookup(tupleN(1), admission.OpRead)
	if err != nil || gen != 1 || !g.Tuple.Equal(tupleN(1)) {
		t.Fatalf("Lookup = %+v, %d, %v", g, gen, err)
	}
	if _, _, err := f.lookup(tupleN(3), admission.OpRead); !errors.Is(err, admission.ErrNoGrant) {
		t.Errorf("unknown tuple: err = %v, want ErrNoGrant", err)
	}
	if _, _, err := f.r.Lookup(context.Background(), "not-a-digest", admission.OpRead); !errors.Is(err, admission.ErrNoGrant) {
		t.Errorf("malformed digest: err = %v, want ErrNoGrant", err)
	}
	for _, op := range []admission.Op{admission.OpWrite, admission.OpExec, admission.OpKill, "sudo", ""} {
		if _, _, err := f.lookup(tupleN(1), op); !errors.Is(err, admission.ErrOpNotAllowed) {
			t.Errorf("op %q: err = %v, want ErrOpNotAllowed", op, err)
		}
	}
	f.clk.Set(t0.Add(time.Minute + time.Nanosecond))
	if _, _, err := f.lookup(tupleN(2), admission.OpRead); !errors.Is(err, admission.ErrGrantExpired) {
		t.Errorf("grant past not_after: err = %v, want ErrGrantExpired", err)
	}
	if _, _, err := f.lookup(tupleN(1), admission.OpRead); err != nil {
		t.Errorf("other grant still current: %v", err)
	}
	f.clk.Set(na.Add(time.Nanosecond))
	_, _, err = f.lookup(tupleN(1), admission.OpRead)
	var te *TrustError
	if !errors.Is(err, admission.ErrGrantExpired) || !errors.As(err, &te) || te.Check != CheckExpiry {
		t.Errorf("snapshot past not_after, file unchanged: err = %v, want CheckExpiry wrapping ErrGrantExpired", err)
	}
}

func TestRefresherReturnsCopies(t *testing.T) {
	f := newRefresherFixture(t, RefresherOptions{NoWatch: true})
	na := t0.Add(time.Hour)
	g := grantFor(tupleN(1), na, admission.OpRead)
	g.Groups = []uint32{60010}
	mustPublish(t, f.pub, inputWith(0, na, g))
	got, _, _ := f.lookup(tupleN(1), admission.OpRead)
	got.Ops[0] = admission.OpExec
	got.Groups[0] = 0
	if _, _, err := f.lookup(tupleN(1), admission.OpExec); !errors.Is(err, admission.ErrOpNotAllowed) {
		t.Fatal("mutating a returned grant changed the snapshot's ops")
	}
	again, _, _ := f.lookup(tupleN(1), admission.OpRead)
	if again.Groups[0] != 60010 {
		t.Fatal("mutating a returned grant changed the snapshot's groups")
	}
}

// TestRefresherRenameVisibleWithoutEvents proves what a 9p or virtiofs
// share needs: with no fsnotify at all, each rename is visible to the very
// next request.
func TestRefresherRenameVisibleWithoutEvents(t *testing.T) {
	for _, watch := range []bool{false, true} {
		t.Run(fmt.Sprintf("watch=%v", watch), func(t *testing.T) {
			f := newRefresherFixture(t, RefresherOptions{NoWatch: !watch})
			na := t0.Add(time.Hour)
			for i := 1; i <= 50; i++ {
				pub := mustPublish(t, f.pub, inputWith(0, na, grantFor(tupleN(i), na, admission.OpRead)))
				_, gen, err := f.lookup(tupleN(i), admission.OpRead)
				if err != nil || gen != pub.Generation {
					t.Fatalf("right after publishing generation %d: gen %d, err %v", pub.Generation, gen, err)
				}
				if _, _, err := f.lookup(tupleN(i-1), admission.OpRead); !errors.Is(err, admission.ErrNoGrant) {
					t.Fatalf("generation %d: the previous tuple is still granted: %v", pub.Generation, err)
				}
			}
		})
	}
}

func TestRefresherFailsClosed(t *testing.T) {
	f := newRefresherFixture(t, RefresherOptions{NoWatch: true})
	na := t0.Add(time.Hour)
	path := filepath.Join(f.dir, admission.FileName)
	mustPublish(t, f.pub, inputWith(5, na, grantFor(tupleN(1), na)))
	ok := func(what string) {
		t.Helper()
		if _, _, err := f.lookup(tupleN(1), admission.OpRead); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	refused := func(what string, sentinel error) {
		t.Helper()
		if _, _, err := f.lookup(tupleN(1), admission.OpRead); !errors.Is(err, sentinel) {
			t.Fatalf("%s: err = %v, want %v (no fallback to the cached snapshot)", what, err, sentinel)
		}
	}
	ok("published")

	os.Chmod(path, 0o664)
	refused("file made group-writable", ErrFileMode)
	os.Chmod(path, 0o644)
	ok("mode restored")

	os.Chmod(f.dir, 0o777)
	refused("directory made world-writable, file untouched", ErrDirectory)
	os.Chmod(f.dir, 0o755)
	ok("directory mode restored")

	saved, _ := os.ReadFile(path)
	os.Rename(path, path+".away")
	refused("file removed", ErrFileMissing)
	os.Symlink(path+".away", path)
	refused("file replaced by a symlink", ErrSymlink)
	os.Remove(path)
	os.Rename(path+".away", path)

	writeSigned(t, f.dir, testKey(t), admission.Snapshot{Generation: 6, NotAfter: na, Grants: []admission.Grant{grantFor(tupleN(1), na)}})
	refused("file signed by another key", ErrSignature)

	os.WriteFile(path+".tmp", saved[:len(saved)/2], 0o644)
	os.Rename(path+".tmp", path)
	refused("truncated file", ErrSignature)

	os.WriteFile(path+".tmp", saved, 0o644)
	os.Rename(path+".tmp", path)
	ok("original file back")
}

func TestRefresherRefusesRollback(t *testing.T) {
	f := newRefresherFixture(t, RefresherOptions{NoWatch: true})
	na := t0.Add(time.Hour)
	path := filepath.Join(f.dir, admission.FileName)
	mustPublish(t, f.pub, inputWith(3, na, grantFor(tupleN(1), na)))
	old, _ := os.ReadFile(path)
	mustPublish(t, f.pub, inputWith(0, na, grantFor(tupleN(1), na)))
	if _, gen, err := f.lookup(tupleN(1), admission.OpRead); err != nil || gen != 4 {
		t.Fatalf("generation 4: %d, %v", gen, err)
	}
	// An attacker (or a restored backup) puts the older, validly signed file back.
	os.WriteFile(path+".tmp", old, 0o644)
	os.Rename(path+".tmp", path)
	if _, _, err := f.lookup(tupleN(1), admission.OpRead); !errors.Is(err, ErrRollback) {
		t.Fatalf("generation 3 after 4: err = %v, want ErrRollback", err)
	}
	mustPublish(t, f.pub, inputWith(5, na, grantFor(tupleN(1), na)))
	if _, gen, err := f.lookup(tupleN(1), admission.OpRead); err != nil || gen != 5 {
		t.Fatalf("generation 5 after a refused rollback: %d, %v", gen, err)
	}
}

func TestRefresherErrorStateIsReusedBriefly(t *testing.T) {
	f := newRefresherFixture(t, RefresherOptions{NoWatch: true, ErrorRetry: time.Hour})
	na := t0.Add(time.Hour)
	writeSigned(t, f.dir, testKey(t), admission.Snapshot{Generation: 1, NotAfter: na})
	if _, _, err := f.lookup(tupleN(1), admission.OpRead); !errors.Is(err, ErrSignature) {
		t.Fatalf("foreign key: %v", err)
	}
	// The same broken file is not loaded again (the error is reused)...
	loads := f.r.l.loads.Load()
	if _, _, err := f.lookup(tupleN(1), admission.OpRead); !errors.Is(err, ErrSignature) {
		t.Fatalf("second lookup: %v", err)
	}
	if n := f.r.l.loads.Load(); n != loads {
		t.Fatalf("an unchanged broken file was loaded again (%d loads, want %d)", n, loads)
	}
	// ...but a rename is still seen by the next request.
	os.Remove(filepath.Join(f.dir, admission.FileName))
	mustPublish(t, f.pub, inputWith(0, na, grantFor(tupleN(1), na)))
	if _, _, err := f.lookup(tupleN(1), admission.OpRead); err != nil {
		t.Fatalf("good file after a cached failure: %v", err)
	}
}

func TestRefresherConcurrentLookupsDuringPublish(t *testing.T) {
	f := newRefresherFixture(t, RefresherOptions{})
	na := t0.Add(time.Hour)
	mustPublish(t, f.pub, inputWith(0, na, grantFor(tupleN(1), na)))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, gen, err := f.lookup(tupleN(1), admission.OpRead)
				if err != nil || gen < last {
					t.Errorf("lookup during publishing: gen %d after %d, err %v", gen, last, err)
					return
				}
				last = gen
			}
		}()
	}
	for i := 0; i < 100; i++ {
		mustPublish(t, f.pub, inputWith(0, na, grantFor(tupleN(1), na)))
	}
	close(stop)
	wg.Wait()
}

func TestRefresherCloseTwice(t *testing.T) {
	f := newRefresherFixture(t, RefresherOptions{})
	if err := f.r.Close(); err != nil {
		t.Fatal(err)
	}
	f.r.Close()
	na := t0.Add(time.Hour)
	mustPublish(t, f.pub, inputWith(0, na, grantFor(tupleN(1), na)))
	if _, _, err := f.lookup(tupleN(1), admission.OpRead); err != nil {
		t.Fatalf("Lookup after Close: %v", err)
	}
}

// BenchmarkRefreshLookup is the request-time path: two lstats, a map lookup
// and a copy of the grant. BenchmarkRefreshBaselineLstat is a single bare
// lstat of the same file in the same run, for the ratio.
func BenchmarkRefreshLookup(b *testing.B) {
	f := newRefresherFixture(b, RefresherOptions{})
	na := time.Now().Add(time.Hour)
	f.clk.Set(time.Now())
	mustPublish(b, f.pub, inputWith(0, na, grantFor(tupleN(1), na)))
	sha := tupleN(1).SHA256()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := f.r.Lookup(ctx, sha, admission.OpRead); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRefreshBaselineLstat(b *testing.B) {
	f := newRefresherFixture(b, RefresherOptions{NoWatch: true})
	na := t0.Add(time.Hour)
	mustPublish(b, f.pub, inputWith(0, na, grantFor(tupleN(1), na)))
	path := filepath.Join(f.dir, admission.FileName)
	var st unix.Stat_t
	b.ReportAllocs()
	for b.Loop() {
		if err := unix.Lstat(path, &st); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRefreshReload is the cost of a request right after a publish: a
// full load with every check and the signature.
func BenchmarkRefreshReload(b *testing.B) {
	f := newRefresherFixture(b, RefresherOptions{NoWatch: true})
	na := t0.Add(time.Hour)
	mustPublish(b, f.pub, inputWith(0, na, grantFor(tupleN(1), na)))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		f.r.dirty.Store(true)
		if _, _, err := f.r.Lookup(ctx, tupleN(1).SHA256(), admission.OpRead); err != nil {
			b.Fatal(err)
		}
	}
}
