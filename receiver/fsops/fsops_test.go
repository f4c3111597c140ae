package fsops

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
)

const (
	testUID = 60101
	testGID = 60102
)

var testLimits = Limits{MaxFileBytes: 1 << 20, MaxListEntries: 100, MaxHashPaths: 16}

// tree makes base/root (the grant root) and base/outside with a secret,
// and returns the open Root plus both paths.
func tree(t *testing.T) (*Root, string, string) {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "a", "b")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(outside, "secret"), "outside secret\n")
	write(t, filepath.Join(root, "hello.txt"), "one\ntwo\nthree\n")
	r, err := OpenRoot(root, Owner{UID: testUID, GID: testGID}, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, root, outside
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestPathEscapes attacks every operation with paths that leave the root.
// Each must fail with ErrEscape and nothing outside may change.
func TestPathEscapes(t *testing.T) {
	r, root, outside := tree(t)
	symlink(t, "/etc", filepath.Join(root, "abs"))
	symlink(t, outside, filepath.Join(root, "abs-out"))
	symlink(t, filepath.Join(root, "hello.txt"), filepath.Join(root, "abs-inside"))
	symlink(t, "../outside", filepath.Join(root, "rel-out"))
	symlink(t, "../../../outside/secret", filepath.Join(root, "a", "b", "deep"))
	symlink(t, "l2", filepath.Join(root, "l1"))
	symlink(t, "../outside/secret", filepath.Join(root, "l2"))
	symlink(t, "/", filepath.Join(root, "slash"))
	symlink(t, "/proc/self/root", filepath.Join(root, "procroot"))
	symlink(t, "../outside/new", filepath.Join(root, "dangling-out"))

	ops := map[string]func(string) error{
		"read":   func(p string) error { _, err := r.Read(p, 0, 0); return err },
		"stat":   func(p string) error { _, err := r.Stat(p); return err },
		"list":   func(p string) error { _, _, err := r.List(p); return err },
		"hash":   func(p string) error { _, err := r.Hash([]string{p}); return err },
		"cwd":    func(p string) error { f, err := r.OpenDir(p); closeIf(f); return err },
		"write":  func(p string) error { _, err := r.Write(WriteRequest{Path: p, Content: []byte("x")}); return err },
		"readat": func(p string) error { _, _, err := r.ReadAt(p, 0, 1); return err },
		"stage": func(p string) error {
			st, err := r.Stage(StageRequest{Path: p, Size: 1, SHA256: sum("x")})
			if st != nil {
				st.Close()
			}
			return err
		},
	}
	cases := []struct{ op, path string }{
		{"read", "../outside/secret"},
		{"read", "a/../../outside/secret"},
		{"read", "OUTSIDE/secret"}, // the absolute path of the outside tree
		{"read", "abs/passwd"},
		{"read", "abs-inside"},
		{"read", "rel-out/secret"},
		{"read", "a/b/deep"},
		{"read", "l1"},
		{"read", "slash/etc/passwd"},
		{"read", "procroot/etc/passwd"},
		{"stat", ".."},
		{"stat", "a/b/../../../outside"},
		{"list", "rel-out"},
		{"list", "abs"},
		{"hash", "l1"},
		{"hash", "../outside/secret"},
		{"cwd", "rel-out"},
		{"cwd", "slash"},
		{"write", "../outside/secret"},
		{"write", "rel-out/new"},
		{"write", "abs-out/new"},
		{"write", "a/b/../../../outside/secret"},
		{"readat", "../outside/secret"},
		{"readat", "l1"},
		{"readat", "procroot/etc/passwd"},
		{"stage", "../outside/secret"},
		{"stage", "rel-out/new"},
		{"stage", "abs-out/new"},
		{"stage", "a/b/../../../outside/secret"},
	}
	for _, c := range cases {
		// The subtest's name stays the same from run to run (the flake
		// hunt counts runs by name), so the temporary path is put in here.
		t.Run(c.op+":"+c.path, func(t *testing.T) {
			p := strings.Replace(c.path, "OUTSIDE", outside, 1)
			if err := ops[c.op](p); !errors.Is(err, ErrEscape) {
				t.Fatalf("%s %q = %v, want ErrEscape", c.op, p, err)
			}
		})
	}
	// A final symlink is never written through, wherever it points.
	if _, err := r.Write(WriteRequest{Path: "dangling-out", Content: []byte("x")}); !errors.Is(err, ErrSymlink) {
		t.Fatalf("write to a dangling symlink out of the root = %v, want ErrSymlink", err)
	}
	if got, _ := os.ReadFile(filepath.Join(outside, "secret")); string(got) != "outside secret\n" {
		t.Fatalf("outside secret changed to %q", got)
	}
	for _, p := range []string{filepath.Join(outside, "new")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s was created outside the root (err %v)", p, err)
		}
	}
}

func closeIf(f *os.File) {
	if f != nil {
		f.Close()
	}
}

// TestMagicLinksRefused uses a /proc/<pid> directory as the root: its
// cwd, root, exe and fd/N entries are magic links. Current kernels refuse
// them under RESOLVE_BENEATH already; RESOLVE_NO_MAGICLINKS keeps that
// true if the kernel ever relaxes it, as openat2(2) warns.
func TestMagicLinksRefused(t *testing.T) {
	r, err := OpenRoot(fmt.Sprintf("/proc/%d", os.Getpid()), Owner{UID: testUID, GID: testGID}, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, p := range []string{"root/etc/passwd", "cwd", "exe", "fd/0", "task/" + fmt.Sprint(os.Getpid()) + "/root/etc/hostname"} {
		if _, err := r.Read(p, 0, 0); !errors.Is(err, ErrEscape) {
			t.Errorf("read %q beneath /proc/<pid> = %v, want ErrEscape", p, err)
		}
	}
	if _, err := r.Stat("status"); err != nil {
		t.Fatalf("plain /proc file refused: %v", err)
	}
}

func TestOpenRootRefusesSymlinkedRoot(t *testing.T) {
	base := t.TempDir()
	if err := os.Mkdir(filepath.Join(base, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, "real", filepath.Join(base, "link"))
	if _, err := OpenRoot(filepath.Join(base, "link"), Owner{}, testLimits); !errors.Is(err, ErrEscape) {
		t.Fatalf("OpenRoot through a symlink = %v, want ErrEscape", err)
	}
	if _, err := OpenRoot("relative", Owner{}, testLimits); !errors.Is(err, ErrInvalid) {
		t.Fatalf("OpenRoot(relative) = %v, want ErrInvalid", err)
	}
}

// TestSymlinkSwapRace swaps root/d between a real directory and a symlink
// to the outside with RENAME_EXCHANGE while reads and writes resolve
// through it. Every result must be the inside file or ErrEscape; both
// outcomes must occur, or the race was not exercised.
func TestSymlinkSwapRace(t *testing.T) {
	r, root, outside := tree(t)
	if err := os.Mkdir(filepath.Join(root, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "d", "secret"), "inside\n")
	symlink(t, "../outside", filepath.Join(root, "alt"))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, "d"), unix.AT_FDCWD, filepath.Join(root, "alt"), unix.RENAME_EXCHANGE)
		}
	}()
	var inside, escaped atomic.Int64
	for i := 0; i < 20000 && (inside.Load() < 50 || escaped.Load() < 50 || i < 2000); i++ {
		res, err := r.Read("d/secret", 0, 0)
		switch {
		case err == nil && res.Content == "inside\n":
			inside.Add(1)
		case errors.Is(err, ErrEscape):
			escaped.Add(1)
		case errors.Is(err, ErrNotFound):
			// "d" named the symlink's other side mid-exchange; harmless.
		default:
			close(stop)
			wg.Wait()
			t.Fatalf("read through a swapped symlink: content %q, err %v", res.Content, err)
		}
		if _, err := r.Write(WriteRequest{Path: "d/w", Content: []byte("w")}); err != nil && !errors.Is(err, ErrEscape) && !errors.Is(err, ErrNotFound) {
			close(stop)
			wg.Wait()
			t.Fatalf("write through a swapped symlink: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	if inside.Load() == 0 || escaped.Load() == 0 {
		t.Fatalf("race not exercised: %d inside, %d escaped", inside.Load(), escaped.Load())
	}
	if _, err := os.Lstat(filepath.Join(outside, "w")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a write landed outside the root (err %v)", err)
	}
	t.Logf("%d reads inside, %d refused as escapes", inside.Load(), escaped.Load())
}

// TestWriteModeIgnoresUmask runs with umask 0000 (and then 0777): modes
// and ownership must be exactly as requested.
func TestWriteModeIgnoresUmask(t *testing.T) {
	testenv.Require(t, "root")
	r, root, _ := tree(t)
	for _, umask := range []int{0o000, 0o777} {
		old := syscall.Umask(umask)
		for _, c := range []struct{ req, want uint32 }{{0, 0o644}, {0o600, 0o600}, {0o755, 0o755}, {0o666, 0o666}} {
			name := fmt.Sprintf("m-%o-%o", umask, c.req)
			if _, err := r.Write(WriteRequest{Path: "a/" + name, Content: []byte("x"), Mode: c.req}); err != nil {
				syscall.Umask(old)
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, "a", name), &st); err != nil {
				syscall.Umask(old)
				t.Fatal(err)
			}
			if st.Mode&0o7777 != c.want || st.Uid != testUID || st.Gid != testGID || st.Mode&unix.S_IFMT != unix.S_IFREG {
				syscall.Umask(old)
				t.Fatalf("umask %#o, mode %#o: file mode %#o owner %d:%d, want %#o %d:%d",
					umask, c.req, st.Mode, st.Uid, st.Gid, c.want, testUID, testGID)
			}
		}
		syscall.Umask(old)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "a"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tether-") {
			t.Fatalf("temporary file %s left behind", e.Name())
		}
	}
	if _, err := r.Write(WriteRequest{Path: "a/suid", Content: []byte("x"), Mode: 0o4755}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("setuid mode accepted: %v", err)
	}
}

func TestWritePreconditions(t *testing.T) {
	testenv.Require(t, "root")
	r, root, _ := tree(t)
	p := filepath.Join(root, "hello.txt")
	if _, err := r.Write(WriteRequest{Path: "hello.txt", Content: []byte("x"), ExpectAbsent: true}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("expect_absent on an existing file = %v", err)
	}
	if _, err := r.Write(WriteRequest{Path: "hello.txt", Content: []byte("x"), ExpectSHA256: sum("other")}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("wrong expect_sha256 = %v", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "one\ntwo\nthree\n" {
		t.Fatalf("refused write changed the file to %q", got)
	}
	res, err := r.Write(WriteRequest{Path: "hello.txt", Content: []byte("new"), ExpectSHA256: sum("one\ntwo\nthree\n")})
	if err != nil || res.SHA256 != sum("new") || res.Size != 3 {
		t.Fatalf("matching expect_sha256: %+v, %v", res, err)
	}
	if _, err := r.Write(WriteRequest{Path: "fresh", Content: []byte("f"), ExpectAbsent: true}); err != nil {
		t.Fatalf("expect_absent on a new file: %v", err)
	}
	if _, err := r.Write(WriteRequest{Path: "missing", Content: []byte("f"), ExpectSHA256: sum("")}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("expect_sha256 on a missing file = %v", err)
	}
	if _, err := r.Write(WriteRequest{Path: "x", ExpectSHA256: "ABC"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("malformed expect_sha256 = %v", err)
	}
}

// TestConcurrentEditsNoLostUpdate: 16 writers with the same expected
// digest race; exactly one may win.
func TestConcurrentEditsNoLostUpdate(t *testing.T) {
	testenv.Require(t, "root")
	r, root, _ := tree(t)
	base := sum("one\ntwo\nthree\n")
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.Write(WriteRequest{Path: "hello.txt", Content: []byte(fmt.Sprint("writer ", i)), ExpectSHA256: base})
			if err == nil {
				wins.Add(1)
			} else if !errors.Is(err, ErrPrecondition) {
				t.Errorf("writer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d writers succeeded with the same expected digest, want 1", wins.Load())
	}
	got, _ := os.ReadFile(filepath.Join(root, "hello.txt"))
	if !strings.HasPrefix(string(got), "writer ") {
		t.Fatalf("file = %q", got)
	}
}

func TestWriteRefusesLinksAndSpecials(t *testing.T) {
	testenv.Require(t, "root")
	r, root, outside := tree(t)
	symlink(t, "hello.txt", filepath.Join(root, "inner-link"))
	if err := os.Link(filepath.Join(outside, "secret"), filepath.Join(root, "hard")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := map[string]error{
		"inner-link": ErrSymlink,
		"hard":       ErrHardLink,
		"fifo":       ErrNotRegular,
		"a":          ErrNotRegular,
		"nodir/x":    ErrNotFound,
		"a/":         ErrInvalid,
		"a/..":       ErrInvalid,
		"":           ErrInvalid,
		"x\x00y":     ErrInvalid,
	}
	for p, want := range cases {
		if _, err := r.Write(WriteRequest{Path: p, Content: []byte("x")}); !errors.Is(err, want) {
			t.Errorf("write %q = %v, want %v", p, err, want)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(outside, "secret")); string(got) != "outside secret\n" {
		t.Fatalf("write through a hard link changed the outside file to %q", got)
	}
	big := make([]byte, testLimits.MaxFileBytes+1)
	if _, err := r.Write(WriteRequest{Path: "big", Content: big}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversize write = %v", err)
	}
}

func TestRead(t *testing.T) {
	r, root, outside := tree(t)
	cases := []struct {
		line, limit int
		want        string
	}{
		{0, 0, "one\ntwo\nthree\n"}, {1, 0, "one\ntwo\nthree\n"}, {2, 0, "two\nthree\n"},
		{2, 1, "two\n"}, {3, 5, "three\n"}, {4, 0, ""}, {9, 1, ""}, {0, 2, "one\ntwo\n"},
	}
	for _, c := range cases {
		res, err := r.Read("hello.txt", c.line, c.limit)
		if err != nil || res.Content != c.want || res.Size != 14 || res.SHA256 != sum("one\ntwo\nthree\n") {
			t.Errorf("Read(line %d, limit %d) = %+v, %v; want %q", c.line, c.limit, res, err, c.want)
		}
	}
	write(t, filepath.Join(root, "bin"), "\xff\xfe")
	if err := os.Link(filepath.Join(outside, "secret"), filepath.Join(root, "hard")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "big"), make([]byte, testLimits.MaxFileBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]error{"bin": ErrNotText, "hard": ErrHardLink, "fifo": ErrNotRegular,
		"a": ErrNotRegular, "nope": ErrNotFound, "big": ErrTooLarge, "hello.txt/x": ErrNotDir} {
		if _, err := r.Read(p, 0, 0); !errors.Is(err, want) {
			t.Errorf("read %q = %v, want %v", p, err, want)
		}
	}
	if _, err := r.Read("hello.txt", -1, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative line accepted: %v", err)
	}
}

func TestStatListHash(t *testing.T) {
	r, root, _ := tree(t)
	symlink(t, "../outside", filepath.Join(root, "out"))
	info, err := r.Stat("out")
	if err != nil || info.Type != "symlink" {
		t.Fatalf("stat of a final symlink = %+v, %v; want the link itself", info, err)
	}
	info, err = r.Stat("hello.txt")
	if err != nil || info.Type != "file" || info.Size != 14 || info.Mode != 0o644 {
		t.Fatalf("stat hello.txt = %+v, %v", info, err)
	}
	if info, err := r.Stat(""); err != nil || info.Type != "dir" {
		t.Fatalf("stat root = %+v, %v", info, err)
	}
	ents, trunc, err := r.List("")
	if err != nil || trunc {
		t.Fatal(err, trunc)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name+":"+e.Type)
	}
	if got := strings.Join(names, ","); got != "a:dir,hello.txt:file,out:symlink" {
		t.Fatalf("list = %s", got)
	}
	small := *r
	small.limits.MaxListEntries = 2
	if ents, trunc, err := small.List(""); err != nil || !trunc || len(ents) != 2 {
		t.Fatalf("bounded list = %d entries, truncated %v, %v", len(ents), trunc, err)
	}
	got, err := r.Hash([]string{"hello.txt", "missing", "a"})
	if err != nil || got["hello.txt"] != sum("one\ntwo\nthree\n") || got["missing"] != "" || got["a"] != "" || len(got) != 3 {
		t.Fatalf("hash = %v, %v", got, err)
	}
	if _, err := r.Hash(make([]string, testLimits.MaxHashPaths+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too many hash paths = %v", err)
	}
}

func TestSelectLines(t *testing.T) {
	for _, c := range []struct {
		in          string
		line, limit int
		want        string
	}{
		{"", 0, 0, ""}, {"a", 1, 1, "a"}, {"a\nb", 2, 1, "b"}, {"a\nb", 3, 0, ""}, {"a\n", 2, 0, ""},
		{"a\nb\nc\n", 2, 0, "b\nc\n"}, {"a\nb\nc", 0, 2, "a\nb\n"},
	} {
		if got := selectPieces([]byte(c.in), c.line, c.limit, 1); got != c.want {
			t.Errorf("select(%q, %d, %d) = %q, want %q", c.in, c.line, c.limit, got, c.want)
		}
		if got := string(refSelectLines([]byte(c.in), c.line, c.limit)); got != c.want {
			t.Errorf("reference(%q, %d, %d) = %q, want %q", c.in, c.line, c.limit, got, c.want)
		}
	}
}

// selectPieces runs a lineSelector over in, given in pieces of n bytes.
func selectPieces(in []byte, line, limit, n int) string {
	s := newLineSelector(line, limit, len(in)+1)
	for len(in) > 0 {
		k := min(n, len(in))
		s.write(in[:k])
		in = in[k:]
	}
	return s.out.String()
}

// refSelectLines is the whole-buffer selection the streaming selector
// must agree with: limit lines starting at the 1-based line (0 = 1);
// limit 0 means to the end. Lines keep their terminating newline.
func refSelectLines(data []byte, line, limit int) []byte {
	start := 0
	for i := 1; i < line; i++ {
		nl := bytes.IndexByte(data[start:], '\n')
		if nl < 0 {
			return nil
		}
		start += nl + 1
	}
	if limit == 0 {
		return data[start:]
	}
	end := start
	for i := 0; i < limit && end < len(data); i++ {
		nl := bytes.IndexByte(data[end:], '\n')
		if nl < 0 {
			return data[start:]
		}
		end += nl + 1
	}
	return data[start:end]
}
