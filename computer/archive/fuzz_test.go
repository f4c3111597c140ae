package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// FuzzImport: whatever the stream, Import writes nothing outside dest,
// leaves dest empty when it fails, and when it succeeds leaves only
// regular files, directories and symlinks without set-id bits, within
// the caps.
func FuzzImport(f *testing.F) {
	f.Add(tarZst(f, []entry{dirEntry("a"), file("a/b", 0o644, "hello"), symlink("a/l", "b")}))
	limits := Limits{MaxBytes: 1 << 20, MaxFiles: 64, MaxStreamBytes: 1 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		scratch := t.TempDir()
		dest := filepath.Join(scratch, "dest")
		if err := os.Mkdir(dest, 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := Import(context.Background(), bytes.NewReader(data), dest,
			ImportOptions{SHA256: digest(data), Owner: Owner{Keep, Keep}, Limits: limits})
		if ents, _ := os.ReadDir(scratch); len(ents) != 1 {
			t.Fatalf("the import wrote beside dest: %v", ents)
		}
		tree := listTree(t, dest)
		if err != nil {
			if len(tree) != 0 {
				t.Fatalf("failed import (%v) left %q", err, tree)
			}
			return
		}
		if int64(len(tree)) > limits.MaxFiles {
			t.Fatalf("%d entries, over the cap", len(tree))
		}
		for _, p := range tree {
			fi, err := os.Lstat(filepath.Join(dest, p))
			if err != nil {
				t.Fatal(err)
			}
			if m := fi.Mode(); m&(fs.ModeSetuid|fs.ModeSetgid) != 0 || !(m.IsRegular() || m.IsDir() || m&fs.ModeSymlink != 0) {
				t.Fatalf("%s has mode %v", p, m)
			}
		}
	})
}

// FuzzExtractTar: the same invariants as FuzzImport for a plain tar
// stream, so the fuzzer works on the entries rather than on zstd frames.
func FuzzExtractTar(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		scratch := t.TempDir()
		dest := filepath.Join(scratch, "dest")
		if err := os.Mkdir(dest, 0o755); err != nil {
			t.Fatal(err)
		}
		root, err := os.OpenRoot(dest)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		x := newExtractor(newRootSink(root, "", Owner{Keep, Keep}), Limits{MaxBytes: 1 << 20, MaxFiles: 64})
		if err := x.run(context.Background(), tar.NewReader(bytes.NewReader(data))); err != nil {
			if rerr := removeContents(root); rerr != nil {
				t.Fatalf("remove after %v: %v", err, rerr)
			}
		}
		if ents, _ := os.ReadDir(scratch); len(ents) != 1 {
			t.Fatalf("the extraction wrote beside dest: %v", ents)
		}
		for _, p := range listTree(t, dest) {
			fi, err := os.Lstat(filepath.Join(dest, p))
			if err != nil {
				t.Fatal(err)
			}
			if m := fi.Mode(); m&(fs.ModeSetuid|fs.ModeSetgid) != 0 || !(m.IsRegular() || m.IsDir() || m&fs.ModeSymlink != 0) {
				t.Fatalf("%s has mode %v", p, m)
			}
		}
	})
}
