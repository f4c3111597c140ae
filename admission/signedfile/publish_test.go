package signedfile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
)

func TestPublishGenerations(t *testing.T) {
	dir, k := adminDir(t), testKey(t)
	p := newTestPublisher(t, dir, k, clockAt(t0))
	l := newTestLoader(t, dir, k.Public(), clockAt(t0))
	na := t0.Add(time.Hour)
	in := inputWith(0, na, grantFor(tupleN(1), na))

	for want := uint64(1); want <= 3; want++ {
		got := mustPublish(t, p, in)
		if got.Generation != want {
			t.Fatalf("omitted generation: published %d, want %d", got.Generation, want)
		}
		ld, err := l.Load(context.Background())
		if err != nil || ld.Snapshot.Generation != want || ld.SHA256 != got.SHA256 {
			t.Fatalf("Load after publish %d = %+v, %v", want, ld, err)
		}
		data, _ := os.ReadFile(got.Path)
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != got.SHA256 {
			t.Fatalf("Published.SHA256 %s is not the file's", got.SHA256)
		}
	}
	if got := mustPublish(t, p, inputWith(10, na, grantFor(tupleN(1), na))); got.Generation != 10 {
		t.Fatalf("given generation 10: published %d", got.Generation)
	}
	before, _ := os.ReadFile(filepath.Join(dir, admission.FileName))
	for _, gen := range []uint64{10, 9, 1} {
		_, err := p.Publish(context.Background(), inputWith(gen, na, grantFor(tupleN(1), na)))
		var ge *GenerationError
		if !errors.As(err, &ge) || ge.Given != gen || ge.Current != 10 || !errors.Is(err, ErrGenerationNotNewer) {
			t.Fatalf("given generation %d <= current 10: err = %v", gen, err)
		}
	}
	after, _ := os.ReadFile(filepath.Join(dir, admission.FileName))
	if string(before) != string(after) {
		t.Fatal("a refused publish changed the file")
	}
	if got := mustPublish(t, p, in); got.Generation != 11 {
		t.Fatalf("omitted after 10: %d, want 11", got.Generation)
	}
}

func TestPublishFileShape(t *testing.T) {
	old := syscall.Umask(0o077) // the file must be readable whatever the umask
	defer syscall.Umask(old)
	dir, k := adminDir(t), testKey(t)
	os.WriteFile(filepath.Join(dir, tempPrefix+"stale"), []byte("left by a crash"), 0o600)
	p := newTestPublisher(t, dir, k, clockAt(t0))
	na := t0.Add(time.Hour)
	pub := mustPublish(t, p, inputWith(0, na, grantFor(tupleN(1), na)))
	fi, err := os.Lstat(pub.Path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("published file: %v, %v; want a regular 0644 file", fi.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	want := []string{".admission.lock", admission.FileName}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("directory holds %v, want only %v (stale temp removed, no temp left)", names, want)
	}
}

func TestPublishRefuses(t *testing.T) {
	k := testKey(t)
	na := t0.Add(time.Hour)
	good := inputWith(0, na, grantFor(tupleN(1), na))

	wdir := adminDir(t)
	os.Chmod(wdir, 0o775)
	if _, err := newTestPublisher(t, wdir, k, clockAt(t0)).Publish(context.Background(), good); !errors.Is(err, ErrPublishDir) {
		t.Errorf("group-writable dir: err = %v, want ErrPublishDir", err)
	}
	real := adminDir(t)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(real, link)
	if _, err := newTestPublisher(t, link, k, clockAt(t0)).Publish(context.Background(), good); !errors.Is(err, ErrPublishDir) {
		t.Errorf("symlinked dir: err = %v, want ErrPublishDir", err)
	}

	dir := adminDir(t)
	p := newTestPublisher(t, dir, k, clockAt(t0))
	expired := inputWith(0, t0, grantFor(tupleN(1), t0))
	if _, err := p.Publish(context.Background(), expired); !errors.Is(err, ErrAlreadyExpired) {
		t.Errorf("snapshot ending now: err = %v, want ErrAlreadyExpired", err)
	}
	grantExpired := inputWith(0, na, grantFor(tupleN(1), t0.Add(-time.Second)))
	if _, err := p.Publish(context.Background(), grantExpired); !errors.Is(err, ErrAlreadyExpired) {
		t.Errorf("expired grant: err = %v, want ErrAlreadyExpired", err)
	}
	bad := good
	bad.Grants = []admission.Grant{grantFor(tupleN(1), na)}
	bad.Grants[0].UID = 0
	if _, err := p.Publish(context.Background(), bad); !errors.Is(err, admission.ErrInvalidGrant) {
		t.Errorf("uid 0: err = %v, want ErrInvalidGrant", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, admission.FileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused publishes wrote a file: %v", err)
	}

	writeSigned(t, dir, testKey(t), admission.Snapshot{Generation: 5, NotAfter: na})
	before, _ := os.ReadFile(filepath.Join(dir, admission.FileName))
	if _, err := p.Publish(context.Background(), good); !errors.Is(err, ErrCurrentUnreadable) {
		t.Errorf("current file signed by another key: err = %v, want ErrCurrentUnreadable", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, admission.FileName)); string(after) != string(before) {
		t.Error("publish replaced a file it could not read")
	}
}

func TestPublishWaitsForLock(t *testing.T) {
	dir, k := adminDir(t), testKey(t)
	p := newTestPublisher(t, dir, k, clockAt(t0))
	na := t0.Add(time.Hour)
	lf, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := p.Publish(ctx, inputWith(0, na)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish while another holds the lock: err = %v, want the context deadline", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, admission.FileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("publish wrote without the lock")
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.Publish(context.Background(), inputWith(0, na))
		done <- err
	}()
	syscall.Flock(int(lf.Fd()), syscall.LOCK_UN)
	if err := <-done; err != nil {
		t.Fatalf("publish after the lock was released: %v", err)
	}
}

func TestPublishConcurrentDistinctGenerations(t *testing.T) {
	dir, k := adminDir(t), testKey(t)
	na := t0.Add(time.Hour)
	const workers, each = 6, 10
	gens := make(chan uint64, workers*each)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		p := newTestPublisher(t, dir, k, clockAt(t0)) // one publisher each, as separate processes would
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				pub, err := p.Publish(context.Background(), inputWith(0, na, grantFor(tupleN(1), na)))
				if err != nil {
					t.Errorf("Publish: %v", err)
					return
				}
				gens <- pub.Generation
			}
		}()
	}
	wg.Wait()
	close(gens)
	seen := map[uint64]bool{}
	for g := range gens {
		if seen[g] {
			t.Fatalf("generation %d published twice", g)
		}
		seen[g] = true
	}
	for g := uint64(1); g <= workers*each; g++ {
		if !seen[g] {
			t.Fatalf("generation %d missing; got %v", g, seen)
		}
	}
}

// TestPublishGenerationExhausted: after math.MaxUint64 there is no next
// generation. An omitted one is refused (no wrap to 0, which every loader
// would refuse and after which the publisher could not publish again), the
// file is left as it was, and a loader still accepts it.
func TestPublishGenerationExhausted(t *testing.T) {
	dir, k := adminDir(t), testKey(t)
	p := newTestPublisher(t, dir, k, clockAt(t0))
	na := t0.Add(time.Hour)
	top := mustPublish(t, p, inputWith(math.MaxUint64, na, grantFor(tupleN(1), na)))
	if top.Generation != math.MaxUint64 {
		t.Fatalf("given generation MaxUint64: published %d", top.Generation)
	}
	_, err := p.Publish(context.Background(), inputWith(0, na, grantFor(tupleN(2), na)))
	if !errors.Is(err, ErrGenerationExhausted) || !strings.Contains(err.Error(), "check generation failed") {
		t.Fatalf("omitted generation after MaxUint64: err = %v, want ErrGenerationExhausted naming the check", err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, admission.FileName))
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != top.SHA256 {
		t.Fatal("a refused publish changed the file")
	}
	ld, err := newTestLoader(t, dir, k.Public(), clockAt(t0)).Load(context.Background())
	if err != nil || ld.Snapshot.Generation != math.MaxUint64 || ld.SHA256 != top.SHA256 {
		t.Fatalf("Load after the refusal = %+v, %v; want generation MaxUint64, the same file", ld, err)
	}
}

// TestEnvelopeValidatesBeforeSigning: whatever generation reaches
// envelope, it signs only a snapshot the loader accepts.
func TestEnvelopeValidatesBeforeSigning(t *testing.T) {
	p := newTestPublisher(t, adminDir(t), testKey(t), clockAt(t0))
	na := t0.Add(time.Hour)
	if data, err := p.envelope(context.Background(), 0, inputWith(0, na, grantFor(tupleN(1), na))); !errors.Is(err, admission.ErrInvalidSnapshot) {
		t.Fatalf("envelope(generation 0) = %d bytes, %v; want ErrInvalidSnapshot and nothing signed", len(data), err)
	}
	late := inputWith(0, na, grantFor(tupleN(1), na.Add(time.Second)))
	if _, err := p.envelope(context.Background(), 1, late); !errors.Is(err, admission.ErrInvalidGrant) {
		t.Fatalf("envelope(grant outliving the snapshot) err = %v, want ErrInvalidGrant", err)
	}
}
