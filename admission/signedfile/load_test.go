package signedfile

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// published returns a directory holding one valid file of generation gen,
// its key and a loader for it.
func published(t *testing.T, gen uint64) (string, signing.PrivateKey, *Loader) {
	t.Helper()
	dir, k := adminDir(t), testKey(t)
	na := t0.Add(time.Hour)
	mustPublish(t, newTestPublisher(t, dir, k, clockAt(t0)), inputWith(gen, na, grantFor(tupleN(1), na)))
	return dir, k, newTestLoader(t, dir, k.Public(), clockAt(t0))
}

// wantCheck asserts err is a *TrustError for check c, wraps sentinel and
// ErrUntrusted, and names the check in its message.
func wantCheck(t *testing.T, what string, err error, c Check, sentinel error) {
	t.Helper()
	var te *TrustError
	switch {
	case !errors.As(err, &te):
		t.Errorf("%s: err = %v, want *TrustError %s", what, err, c)
	case te.Check != c:
		t.Errorf("%s: check %s (%v), want %s", what, te.Check, err, c)
	case !errors.Is(err, sentinel) || !errors.Is(err, ErrUntrusted):
		t.Errorf("%s: %v does not wrap %v and ErrUntrusted", what, err, sentinel)
	case !strings.Contains(err.Error(), "check "+string(c)+" failed"):
		t.Errorf("%s: message %q does not name check %s", what, err, c)
	}
}

func load(l *Loader) error {
	_, err := l.Load(context.Background())
	return err
}

func TestLoadAcceptsPublished(t *testing.T) {
	_, _, l := published(t, 3)
	ld, err := l.Load(context.Background())
	if err != nil || ld.Snapshot.Generation != 3 || len(ld.Snapshot.Grants) != 1 {
		t.Fatalf("Load = %+v, %v", ld, err)
	}
	if l.LastGeneration() != 3 {
		t.Fatalf("LastGeneration = %d", l.LastGeneration())
	}
}

func TestLoadRefusesMissingAndSymlinks(t *testing.T) {
	dir, k := adminDir(t), testKey(t)
	l := newTestLoader(t, dir, k.Public(), clockAt(t0))
	wantCheck(t, "missing file", load(l), CheckExists, ErrFileMissing)
	nodir := newTestLoader(t, filepath.Join(dir, "nope"), k.Public(), clockAt(t0))
	wantCheck(t, "missing dir", load(nodir), CheckExists, ErrFileMissing)

	src, k2, _ := published(t, 1)
	os.Symlink(filepath.Join(src, admission.FileName), filepath.Join(dir, admission.FileName))
	wantCheck(t, "symlinked file", load(newTestLoader(t, dir, k2.Public(), clockAt(t0))), CheckSymlink, ErrSymlink)

	parent := t.TempDir()
	os.Symlink(src, filepath.Join(parent, "via"))
	wantCheck(t, "symlinked directory", load(newTestLoader(t, filepath.Join(parent, "via"), k2.Public(), clockAt(t0))), CheckSymlink, ErrSymlink)
	os.Symlink(filepath.Dir(src), filepath.Join(parent, "up"))
	deep := filepath.Join(parent, "up", filepath.Base(src))
	wantCheck(t, "symlink in a parent component", load(newTestLoader(t, deep, k2.Public(), clockAt(t0))), CheckSymlink, ErrSymlink)
}

func TestLoadRefusesDirectoryModes(t *testing.T) {
	for _, mode := range []os.FileMode{0o775, 0o757, 0o777, 0o1777 | os.ModeSticky} {
		dir, _, l := published(t, 1)
		os.Chmod(dir, mode)
		wantCheck(t, "dir mode "+mode.String(), load(l), CheckDirectory, ErrDirectory)
	}
}

func TestLoadRefusesFileKinds(t *testing.T) {
	dir, k := adminDir(t), testKey(t)
	l := newTestLoader(t, dir, k.Public(), clockAt(t0))
	if err := syscall.Mkfifo(filepath.Join(dir, admission.FileName), 0o644); err != nil {
		t.Fatal(err)
	}
	wantCheck(t, "fifo (must not block)", load(l), CheckRegular, ErrNotRegular)
	os.Remove(filepath.Join(dir, admission.FileName))
	os.Mkdir(filepath.Join(dir, admission.FileName), 0o755)
	wantCheck(t, "directory", load(l), CheckRegular, ErrNotRegular)
}

func TestLoadRefusesFileModeOwnerSize(t *testing.T) {
	for _, mode := range []os.FileMode{0o664, 0o646, 0o666, 0o622} {
		dir, _, l := published(t, 1)
		os.Chmod(filepath.Join(dir, admission.FileName), mode)
		wantCheck(t, "file mode "+mode.String(), load(l), CheckFileMode, ErrFileMode)
	}
	dir, k, _ := published(t, 1)
	t.Run("owner", func(t *testing.T) {
		// As root the directory (owned by uid 0) passes its check and the
		// file's owner is what fails; as anyone else the directory, owned
		// by the caller, would fail first.
		testenv.Require(t, "root")
		other, _ := NewLoader(LoaderConfig{Path: filepath.Join(dir, admission.FileName), PublicKey: k.Public(),
			OwnerUID: uidp(os.Geteuid() + 60001), Now: clockAt(t0)})
		wantCheck(t, "owner", load(other), CheckOwner, ErrOwner)
	})

	small, _ := NewLoader(LoaderConfig{Path: filepath.Join(dir, admission.FileName), PublicKey: k.Public(),
		OwnerUID: uidp(os.Geteuid()), MaxBytes: 100, Now: clockAt(t0)})
	wantCheck(t, "oversized", load(small), CheckSize, ErrTooLarge)
}

func TestLoadRefusesForeignOwnedAsRoot(t *testing.T) {
	testenv.Require(t, "root")
	dir, _, l := published(t, 1)
	os.Chown(filepath.Join(dir, admission.FileName), 60001, 60001)
	wantCheck(t, "file owned by uid 60001", load(l), CheckOwner, ErrOwner)

	dir, _, l = published(t, 1)
	os.Chown(dir, 60001, 60001)
	wantCheck(t, "dir owned by uid 60001", load(l), CheckDirectory, ErrDirectory)
}

func TestLoadRefusesSignatureFailures(t *testing.T) {
	na := t0.Add(time.Hour)
	snap := admission.Snapshot{Generation: 1, NotAfter: na, Grants: []admission.Grant{grantFor(tupleN(1), na)}}

	dir, _, l := published(t, 1)
	writeSigned(t, dir, testKey(t), snap)
	wantCheck(t, "wrong key", load(l), CheckSignature, ErrSignature)
	if err := load(l); !errors.Is(err, signing.ErrSignature) {
		t.Errorf("wrong key: %v does not wrap signing.ErrSignature", err)
	}

	dir, _, l = published(t, 1)
	path := filepath.Join(dir, admission.FileName)
	data, _ := os.ReadFile(path)
	var env map[string]any
	json.Unmarshal(data, &env)
	payload, _ := base64.StdEncoding.DecodeString(env["payload"].(string))
	env["payload"] = base64.StdEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"uid":60001`, `"uid":60002`, 1)))
	tampered, _ := json.Marshal(env)
	os.WriteFile(path, tampered, 0o644)
	wantCheck(t, "tampered payload", load(l), CheckSignature, ErrSignature)

	env["payload"] = base64.StdEncoding.EncodeToString(payload)
	env["payloadType"] = "application/vnd.in-toto+json"
	relabelled, _ := json.Marshal(env)
	os.WriteFile(path, relabelled, 0o644)
	wantCheck(t, "other payload type", load(l), CheckSignature, ErrSignature)
	if err := load(l); !errors.Is(err, signing.ErrPayloadType) {
		t.Errorf("other payload type: %v does not wrap signing.ErrPayloadType", err)
	}

	os.WriteFile(path, []byte("{}"), 0o644)
	wantCheck(t, "empty envelope", load(l), CheckSignature, ErrSignature)
}

func TestLoadRefusesSchema(t *testing.T) {
	na := t0.Add(time.Hour)
	dir, k, l := published(t, 1)
	writeSigned(t, dir, k, `{"generation":2,"not_after":"2026-11-01T01:00:00Z","grants":[],"fallback":"inline"}`)
	wantCheck(t, "unknown field", load(l), CheckSchema, ErrSchema)
	g := grantFor(tupleN(1), na)
	g.UID = 0
	writeSigned(t, dir, k, admission.Snapshot{Generation: 2, NotAfter: na, Grants: []admission.Grant{g}})
	wantCheck(t, "uid 0", load(l), CheckSchema, ErrSchema)
	g = grantFor(tupleN(1), na.Add(time.Second))
	writeSigned(t, dir, k, admission.Snapshot{Generation: 2, NotAfter: na, Grants: []admission.Grant{g}})
	wantCheck(t, "grant outlives snapshot", load(l), CheckSchema, ErrSchema)
}

func TestLoadRefusesExpired(t *testing.T) {
	dir, k, _ := published(t, 1)
	na := t0.Add(time.Hour)
	at := func(now time.Time) *Loader { return newTestLoader(t, dir, k.Public(), clockAt(now)) }
	if err := load(at(na)); err != nil {
		t.Fatalf("at exactly not_after: %v (not_after is inclusive)", err)
	}
	err := load(at(na.Add(time.Nanosecond)))
	wantCheck(t, "expired", err, CheckExpiry, ErrSnapshotExpired)
	if !errors.Is(err, admission.ErrGrantExpired) {
		t.Errorf("expired: %v does not wrap ErrGrantExpired", err)
	}
}

func TestLoadRefusesRollback(t *testing.T) {
	dir, k, l := published(t, 5)
	if err := load(l); err != nil {
		t.Fatal(err)
	}
	na := t0.Add(time.Hour)
	writeSigned(t, dir, k, admission.Snapshot{Generation: 4, NotAfter: na})
	wantCheck(t, "lower generation", load(l), CheckGeneration, ErrRollback)
	writeSigned(t, dir, k, admission.Snapshot{Generation: 5, NotAfter: na})
	wantCheck(t, "same generation, other content", load(l), CheckGeneration, ErrRollback)
	if l.LastGeneration() != 5 {
		t.Fatalf("refused loads moved LastGeneration to %d", l.LastGeneration())
	}
	writeSigned(t, dir, k, admission.Snapshot{Generation: 6, NotAfter: na})
	if err := load(l); err != nil || l.LastGeneration() != 6 {
		t.Fatalf("generation 6 after refusals: %v, last %d", err, l.LastGeneration())
	}
	if err := load(l); err != nil {
		t.Fatalf("same file twice: %v", err)
	}
	floor, _ := NewLoader(LoaderConfig{Path: filepath.Join(dir, admission.FileName), PublicKey: k.Public(),
		OwnerUID: uidp(os.Geteuid()), MinGeneration: 7, Now: clockAt(t0)})
	wantCheck(t, "below MinGeneration", load(floor), CheckGeneration, ErrRollback)
}

func TestNewLoaderRefusesConfig(t *testing.T) {
	k := testKey(t)
	cases := map[string]LoaderConfig{
		"no owner":     {Path: "/x/" + admission.FileName, PublicKey: k.Public()},
		"relative":     {Path: admission.FileName, PublicKey: k.Public(), OwnerUID: uidp(0)},
		"no key":       {Path: "/x/" + admission.FileName, OwnerUID: uidp(0)},
		"huge limit":   {Path: "/x/" + admission.FileName, PublicKey: k.Public(), OwnerUID: uidp(0), MaxBytes: HardMaxBytes + 1},
		"negative max": {Path: "/x/" + admission.FileName, PublicKey: k.Public(), OwnerUID: uidp(0), MaxBytes: -1},
	}
	for name, cfg := range cases {
		if _, err := NewLoader(cfg); !errors.Is(err, ErrLoaderConfig) {
			t.Errorf("%s: err = %v, want ErrLoaderConfig", name, err)
		}
	}
}

func TestLoadHonoursContext(t *testing.T) {
	_, _, l := published(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Load(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: err = %v", err)
	}
}

// TestLoadConcurrentNoFalseRollback: load A has read generation 1 when
// generation 2 is published and load B starts. Were B to accept 2 while A
// is in flight, A would then report its 1 as a rollback although the file
// never went back. Loads take turns, so both succeed. (Without the turns B
// finishes within the wait below and A fails with ErrRollback.)
func TestLoadConcurrentNoFalseRollback(t *testing.T) {
	dir, k, l := published(t, 1)
	p := newTestPublisher(t, dir, k, clockAt(t0))
	na := t0.Add(time.Hour)
	aChecked, releaseA := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	l.afterChecks = func() {
		if calls.Add(1) == 1 { // load A only; B must not wait here
			close(aChecked)
			<-releaseA
		}
	}
	type result struct {
		ld  *Loaded
		err error
	}
	aDone, bDone := make(chan result, 1), make(chan result, 1)
	go func() { ld, err := l.Load(context.Background()); aDone <- result{ld, err} }()
	<-aChecked
	mustPublish(t, p, inputWith(2, na, grantFor(tupleN(1), na)))
	go func() { ld, err := l.Load(context.Background()); bDone <- result{ld, err} }()
	var b result
	select {
	case b = <-bDone: // B overtook A: the race this test exists for
	case <-time.After(200 * time.Millisecond):
	}
	close(releaseA)
	a := <-aDone
	if b.ld == nil && b.err == nil {
		b = <-bDone
	}
	if a.err != nil || a.ld.Snapshot.Generation != 1 {
		t.Errorf("load A (read generation 1 before generation 2 was published): %+v, %v", a.ld, a.err)
	}
	if b.err != nil || b.ld.Snapshot.Generation != 2 {
		t.Errorf("load B (after generation 2 was published): %+v, %v", b.ld, b.err)
	}
	if l.LastGeneration() != 2 {
		t.Errorf("LastGeneration = %d, want 2", l.LastGeneration())
	}
}

// TestLoadWaitHonoursContext: a Load waiting for its turn ends with ctx.
func TestLoadWaitHonoursContext(t *testing.T) {
	_, _, l := published(t, 1)
	l.turn <- struct{}{} // another load holds the turn
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Load(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Load while another holds the turn: err = %v, want the context deadline", err)
	}
	<-l.turn
	if err := load(l); err != nil {
		t.Fatalf("Load after the turn was released: %v", err)
	}
}
