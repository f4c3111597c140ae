package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// attack is an archive that does harm when extracted naively.
type attack struct {
	name    string
	root    bool // mknod needs root
	entries func(scratch string) []entry
	limits  Limits
	want    error
	// harm reports whether the naive extraction into scratch/dest did
	// what the attack wants.
	harm func(t *testing.T, scratch string) bool
	// rootSinkStops: the os.Root sink alone, with the checks off, also
	// refuses the attack.
	rootSinkStops bool
}

// secret is a file outside the destination that attacks try to reach.
const secret = "secret"

func attacks() []attack {
	exists := func(rel string) func(*testing.T, string) bool {
		return func(_ *testing.T, scratch string) bool {
			_, err := os.Lstat(filepath.Join(scratch, rel))
			return err == nil
		}
	}
	secretIs := func(content string) func(*testing.T, string) bool {
		return func(_ *testing.T, scratch string) bool {
			b, _ := os.ReadFile(filepath.Join(scratch, secret))
			return string(b) == content
		}
	}
	modeHas := func(rel string, bits fs.FileMode) func(*testing.T, string) bool {
		return func(_ *testing.T, scratch string) bool {
			fi, err := os.Lstat(filepath.Join(scratch, "dest", rel))
			return err == nil && fi.Mode()&bits == bits
		}
	}
	return []attack{
		{name: "dotdot", want: ErrUnsafeEntry, rootSinkStops: true, harm: exists("escaped"),
			entries: func(string) []entry { return []entry{file("../escaped", 0o644, "x")} }},
		{name: "dotdot inside", want: ErrUnsafeEntry, rootSinkStops: true, harm: exists("escaped"),
			entries: func(string) []entry { return []entry{dirEntry("a"), file("a/../../escaped", 0o644, "x")} }},
		{name: "absolute", want: ErrUnsafeEntry, rootSinkStops: true, harm: exists("escaped"),
			entries: func(s string) []entry { return []entry{file(filepath.Join(s, "escaped"), 0o644, "x")} }},
		{name: "absolute symlink then file through it", want: ErrUnsafeEntry, rootSinkStops: true, harm: exists("escaped"),
			entries: func(s string) []entry {
				return []entry{symlink("link", s), file("link/escaped", 0o644, "x")}
			}},
		{name: "relative symlink then file through it", want: ErrUnsafeEntry, rootSinkStops: true, harm: exists("escaped"),
			entries: func(string) []entry {
				return []entry{symlink("link", ".."), file("link/escaped", 0o644, "x")}
			}},
		{name: "symlink then file of the same name", want: ErrUnsafeEntry, rootSinkStops: true, harm: secretIs("pwned"),
			entries: func(s string) []entry {
				return []entry{symlink("f", filepath.Join(s, secret)), file("f", 0o644, "pwned")}
			}},
		{name: "hard link then file of the same name", want: ErrUnsafeEntry, rootSinkStops: true, harm: secretIs("pwned"),
			entries: func(s string) []entry {
				return []entry{{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: filepath.Join(s, secret)}},
					file("h", 0o644, "pwned")}
			}},
		{name: "device node", root: true, want: ErrUnsafeEntry, rootSinkStops: true,
			harm: func(_ *testing.T, s string) bool {
				fi, err := os.Lstat(filepath.Join(s, "dest", "mem"))
				return err == nil && fi.Mode()&fs.ModeCharDevice != 0
			},
			entries: func(string) []entry {
				return []entry{{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "mem", Mode: 0o666, Devmajor: 1, Devminor: 1}}}
			}},
		{name: "setuid", want: ErrUnsafeEntry, harm: modeHas("suid", fs.ModeSetuid),
			entries: func(string) []entry { return []entry{file("suid", 0o4755, "#!/bin/sh\n")} }},
		{name: "setgid", want: ErrUnsafeEntry, harm: modeHas("sgid", fs.ModeSetgid),
			entries: func(string) []entry { return []entry{file("sgid", 0o2755, "#!/bin/sh\n")} }},
		{name: "zip bomb over the byte cap", want: ErrTooLarge, limits: Limits{MaxBytes: 1 << 20},
			harm: func(_ *testing.T, s string) bool {
				fi, err := os.Stat(filepath.Join(s, "dest", "bomb"))
				return err == nil && fi.Size() == 64<<20
			},
			entries: func(string) []entry {
				return []entry{file("bomb", 0o644, string(make([]byte, 64<<20)))}
			}},
		{name: "over the file count cap", want: ErrTooLarge, limits: Limits{MaxFiles: 10},
			harm: func(t *testing.T, s string) bool { return len(listTree(t, filepath.Join(s, "dest"))) == 50 },
			entries: func(string) []entry {
				var es []entry
				for i := range 50 {
					es = append(es, file(fmt.Sprintf("f%02d", i), 0o644, ""))
				}
				return es
			}},
	}
}

// newScratch makes scratch/dest and the secret beside it.
func newScratch(t *testing.T) (scratch, dest string) {
	t.Helper()
	scratch = t.TempDir()
	dest = filepath.Join(scratch, "dest")
	if err := os.Mkdir(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(scratch, secret), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	return scratch, dest
}

// assertUntouched: dest is empty, and beside it only the secret, as it was.
func assertUntouched(t *testing.T, scratch string) {
	t.Helper()
	if got := listTree(t, scratch); !slices.Equal(got, []string{"dest", secret}) {
		t.Errorf("scratch holds %q, want only dest (empty) and the secret", got)
	}
	if b, _ := os.ReadFile(filepath.Join(scratch, secret)); string(b) != "secret" {
		t.Errorf("the secret outside dest became %q", b)
	}
}

// TestImportRefusesAttacks: each attack archive is refused with its
// sentinel and leaves dest empty and nothing outside it; the same archive
// extracted naively (checks off, plain paths) does its harm, and for the
// path attacks the os.Root sink alone, with the checks off, refuses too.
func TestImportRefusesAttacks(t *testing.T) {
	for _, a := range attacks() {
		t.Run(strings.ReplaceAll(a.name, " ", "_"), func(t *testing.T) {
			if a.root {
				testenv.Require(t, "root")
			}
			scratch, dest := newScratch(t)
			data := tarZst(t, a.entries(scratch))
			_, err := Import(context.Background(), bytes.NewReader(data), dest,
				ImportOptions{SHA256: digest(data), Owner: Owner{Keep, Keep}, Limits: a.limits})
			if !errors.Is(err, a.want) {
				t.Errorf("import: %v, want %v", err, a.want)
			}
			assertUntouched(t, scratch)

			control, controlDest := newScratch(t)
			data = tarZst(t, a.entries(control))
			if err := importUnchecked(data, naiveSink{base: controlDest}, a.limits); err != nil {
				t.Logf("naive extraction: %v", err)
			}
			if !a.harm(t, control) {
				t.Errorf("positive control: the naive extraction did no harm (%q)", listTree(t, control))
			}

			if a.rootSinkStops {
				layer, layerDest := newScratch(t)
				data = tarZst(t, a.entries(layer))
				root, err := os.OpenRoot(layerDest)
				if err != nil {
					t.Fatal(err)
				}
				defer root.Close()
				err = importUnchecked(data, newRootSink(root, "", Owner{Keep, Keep}), a.limits)
				if err == nil {
					t.Error("the os.Root sink alone let the attack through")
				}
				if got := listTree(t, layer); slices.ContainsFunc(got, func(p string) bool { return !strings.HasPrefix(p, "dest") && p != secret }) || a.harm(t, layer) {
					t.Errorf("the os.Root sink alone: harm done, scratch %q", got)
				}
			}
		})
	}
}

// TestImportDigestMismatch: a stream with one flipped byte, or another
// valid export, is refused with ErrDigestMismatch and dest left empty;
// without the digest check the flipped stream extracts, with content
// that is not the exported one (positive control).
func TestImportDigestMismatch(t *testing.T) {
	body := make([]byte, 64<<10)
	_, _ = rand.Read(body)
	// No content checksum, so only the digest can notice the flip.
	data := tarZst(t, []entry{file("data", 0o644, string(body))}, zstd.WithEncoderCRC(false))
	want := digest(data)
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 0x01

	scratch, dest := newScratch(t)
	_, err := Import(context.Background(), bytes.NewReader(flipped), dest, ImportOptions{SHA256: want, Owner: Owner{Keep, Keep}})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Errorf("flipped byte: %v, want ErrDigestMismatch", err)
	}
	assertUntouched(t, scratch)

	other := tarZst(t, []entry{file("data", 0o644, "another valid export")})
	_, err = Import(context.Background(), bytes.NewReader(other), dest, ImportOptions{SHA256: want, Owner: Owner{Keep, Keep}})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Errorf("substituted export: %v, want ErrDigestMismatch", err)
	}
	assertUntouched(t, scratch)

	_, controlDest := newScratch(t)
	if err := importUnchecked(flipped, naiveSink{base: controlDest}, Limits{}); err != nil {
		t.Fatalf("positive control: the flipped stream does not even extract without the digest check: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(controlDest, "data"))
	if err != nil || bytes.Equal(got, body) {
		t.Errorf("positive control: the flipped stream extracted the exported content (%v)", err)
	}
}

// TestImportRefusesDeepNames: a name more than maxDepth elements deep
// is refused before anything is written; with the check off the same
// entry is written, slowly (positive control).
func TestImportRefusesDeepNames(t *testing.T) {
	deep := strings.Repeat("d/", maxDepth) + "f"
	data := tarZst(t, []entry{file(deep, 0o644, "x")})
	scratch, dest := newScratch(t)
	_, err := Import(context.Background(), bytes.NewReader(data), dest, ImportOptions{SHA256: digest(data), Owner: Owner{Keep, Keep}})
	if !errors.Is(err, ErrUnsafeEntry) {
		t.Errorf("%d elements deep: %v, want ErrUnsafeEntry", maxDepth+1, err)
	}
	assertUntouched(t, scratch)
	_, controlDest := newScratch(t)
	root := openRoot(t, controlDest)
	if err := importUnchecked(data, newRootSink(root, "", Owner{Keep, Keep}), Limits{}); err != nil {
		t.Errorf("positive control: the deep entry is not written with the check off: %v", err)
	}
	if _, err := os.Stat(filepath.Join(controlDest, deep)); err != nil {
		t.Errorf("positive control: %v", err)
	}
}

// TestImportStreamCap: a stream over MaxStreamBytes is refused even when
// its files are within the caps; under the default caps it imports.
func TestImportStreamCap(t *testing.T) {
	body := make([]byte, 32<<10)
	_, _ = rand.Read(body)
	data := tarZst(t, []entry{file("data", 0o644, string(body))})
	scratch, dest := newScratch(t)
	_, err := Import(context.Background(), bytes.NewReader(data), dest,
		ImportOptions{SHA256: digest(data), Owner: Owner{Keep, Keep}, Limits: Limits{MaxStreamBytes: 4 << 10}})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the stream cap: %v, want ErrTooLarge", err)
	}
	assertUntouched(t, scratch)
	if _, err := Import(context.Background(), bytes.NewReader(data), dest,
		ImportOptions{SHA256: digest(data), Owner: Owner{Keep, Keep}}); err != nil {
		t.Errorf("under the default caps: %v", err)
	}
}

// TestImportRefusesBadArguments: no or a malformed expected digest, and
// a directory that is not empty, are refused before anything is read.
func TestImportRefusesBadArguments(t *testing.T) {
	data := tarZst(t, []entry{file("a", 0o644, "a")})
	_, dest := newScratch(t)
	for _, d := range []string{"", strings.ToUpper(digest(data)), digest(data)[:63]} {
		if _, err := Import(context.Background(), bytes.NewReader(data), dest, ImportOptions{SHA256: d}); !errors.Is(err, ErrDigestMismatch) {
			t.Errorf("digest %q: %v", d, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dest, "there"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Import(context.Background(), bytes.NewReader(data), dest, ImportOptions{SHA256: digest(data)}); !errors.Is(err, ErrNotEmpty) {
		t.Errorf("non-empty dir: %v", err)
	}
	if got := listTree(t, dest); !slices.Equal(got, []string{"there"}) {
		t.Errorf("the refused import touched the directory: %q", got)
	}
}
