package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// plainTar builds an uncompressed tar of entries.
func plainTar(t testing.TB, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestWriteExtractTarRoundTrip: a folder written as a tar, extracted
// beneath a new folder and written again gives the same bytes (names,
// modes, symlinks and modification times are kept), and the receipts'
// digests are of those bytes.
func TestWriteExtractTarRoundTrip(t *testing.T) {
	src := t.TempDir()
	makeTree(t, src)
	if err := os.Remove(filepath.Join(src, "suid")); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(src, "work/src/main.go"), old, old); err != nil {
		t.Fatal(err)
	}
	var first bytes.Buffer
	w, err := WriteTar(context.Background(), openRoot(t, filepath.Dir(src)), filepath.Base(src), "proj", &first)
	if err != nil {
		t.Fatal(err)
	}
	if w.SHA256 != digest(first.Bytes()) || w.Skipped != 1 {
		t.Errorf("write receipt %+v: want the digest of the bytes and the fifo skipped", w)
	}
	dst := t.TempDir()
	x, err := ExtractTar(context.Background(), bytes.NewReader(first.Bytes()), openRoot(t, dst), "/a/b", CopyOptions{Owner: Owner{Keep, Keep}})
	if err != nil {
		t.Fatal(err)
	}
	if x.SHA256 != w.SHA256 || x.Bytes != w.Bytes {
		t.Errorf("extract receipt %+v, write receipt %+v: want the same stream", x, w)
	}
	if fi, err := os.Stat(filepath.Join(dst, "a/b/proj/work/src/main.go")); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("extracted main.go: %v, want its modification time %v kept", err, old)
	}
	var second bytes.Buffer
	again, err := WriteTar(context.Background(), openRoot(t, dst), "/a/b/proj", "", &second)
	if err != nil {
		t.Fatal(err)
	}
	if again.SHA256 != w.SHA256 || !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Errorf("the tree written again differs: %s, first %s", again.SHA256, w.SHA256)
	}
}

// TestExtractTarKeepsWhatWasThere is the attack test of the fresh-name
// rule: a stream whose later entry names an existing top name (to write
// into, or over, what was there) is refused, what was there is
// unchanged, and what the stream made before the refusal is removed.
// Positive control: the same stream into an empty folder extracts.
func TestExtractTarKeepsWhatWasThere(t *testing.T) {
	dst := t.TempDir()
	if err := os.WriteFile(filepath.Join(dst, "keep"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	stream := plainTar(t, []entry{dirEntry("new"), file("new/f", 0o644, "x"), file("keep", 0o644, "theirs")})
	_, err := ExtractTar(context.Background(), bytes.NewReader(stream), openRoot(t, dst), "/", CopyOptions{Owner: Owner{Keep, Keep}})
	if !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("extract over an existing name: %v, want ErrNotEmpty", err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "keep")); err != nil || string(b) != "mine" {
		t.Errorf("keep is %q (%v), want it unchanged", b, err)
	}
	if tree := listTree(t, dst); len(tree) != 1 {
		t.Errorf("after the refusal: %q, want only keep", tree)
	}
	into := plainTar(t, []entry{file("keep/x", 0o644, "x")})
	if err := os.Mkdir(filepath.Join(dst, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ExtractTar(context.Background(), bytes.NewReader(into), openRoot(t, dst), "/", CopyOptions{Owner: Owner{Keep, Keep}}); err == nil {
		t.Error("a stream writing beneath an existing file was extracted")
	}
	empty := t.TempDir()
	if _, err := ExtractTar(context.Background(), bytes.NewReader(stream), openRoot(t, empty), "/", CopyOptions{Owner: Owner{Keep, Keep}}); err != nil {
		t.Errorf("positive control: the same stream into an empty folder: %v", err)
	}
}

// TestExtractTarRefusesEscapes: "..", absolute names and a dir outside
// the root are refused and leave nothing, not even the folder the call
// made.
func TestExtractTarRefusesEscapes(t *testing.T) {
	for name, k := range map[string]struct {
		dir    string
		stream []entry
	}{
		"dotdot entry":  {"/in", []entry{file("../x", 0o644, "x")}},
		"absolute name": {"/in", []entry{file("/etc/x", 0o644, "x")}},
		"dotdot dir":    {"/../up", []entry{file("x", 0o644, "x")}},
		"setuid":        {"/in", []entry{{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "s", Mode: 0o4755}}}},
	} {
		scratch := t.TempDir()
		dst := filepath.Join(scratch, "root")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := ExtractTar(context.Background(), bytes.NewReader(plainTar(t, k.stream)), openRoot(t, dst), k.dir, CopyOptions{Owner: Owner{Keep, Keep}})
		if !errors.Is(err, ErrUnsafeEntry) {
			t.Errorf("%s: %v, want ErrUnsafeEntry", name, err)
		}
		if tree := listTree(t, scratch); len(tree) != 1 {
			t.Errorf("%s left %q", name, tree)
		}
	}
}

// FuzzExtractTarFresh: whatever the stream, ExtractTar into a folder
// holding one file leaves that file as it was, writes nothing beside
// the folder, and on failure leaves only that file.
func FuzzExtractTarFresh(f *testing.F) {
	f.Add(plainTar(f, []entry{dirEntry("a"), file("a/b", 0o644, "hello"), symlink("a/l", "b")}))
	f.Add(plainTar(f, []entry{file("keep", 0o644, "theirs")}))
	limits := Limits{MaxBytes: 1 << 20, MaxFiles: 64, MaxStreamBytes: 1 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		scratch := t.TempDir()
		dst := filepath.Join(scratch, "root")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, "keep"), []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		root, err := os.OpenRoot(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		_, err = ExtractTar(context.Background(), bytes.NewReader(data), root, "/", CopyOptions{Owner: Owner{Keep, Keep}, Limits: limits})
		if b, rerr := os.ReadFile(filepath.Join(dst, "keep")); rerr != nil || string(b) != "mine" {
			t.Fatalf("keep is %q (%v)", b, rerr)
		}
		if ents, _ := os.ReadDir(scratch); len(ents) != 1 {
			t.Fatalf("the extraction wrote beside its root: %v", ents)
		}
		if tree := listTree(t, dst); err != nil && len(tree) != 1 {
			t.Fatalf("failed extraction (%v) left %q", err, tree)
		}
	})
}
