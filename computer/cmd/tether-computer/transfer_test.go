package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/archive"
	"github.com/tetherdev/tether/computer/httpserver"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// keep leaves the test's own ids on what memBackend writes.
var keep = archive.Owner{UID: archive.Keep, GID: archive.Keep}

// rootOf opens computer id's root beneath b.dir, made on first use.
func (b *memBackend) rootOf(c api.Caller, id string) (*os.Root, error) {
	b.mu.Lock()
	_, err := b.find(c, id)
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.dir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return os.OpenRoot(dir)
}

func (b *memBackend) Receipts(_ context.Context, c api.Caller, id string) ([]api.Receipt, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, err := b.find(c, id)
	return nil, err
}

func (b *memBackend) TouchAs(_ context.Context, c api.Caller, id string) (api.Computer, error) {
	return b.set(c, id, func(x *api.Computer) { x.State = api.StateRunning })
}

func (b *memBackend) Export(ctx context.Context, c api.Caller, id string) (io.ReadCloser, api.Receipt, error) {
	return b.out(c, id, api.OpExport, func(r *os.Root, w io.Writer) (archive.Receipt, error) { return archive.Export(ctx, r, w) })
}

func (b *memBackend) CopyOut(ctx context.Context, c api.Caller, id, p string) (io.ReadCloser, api.Receipt, error) {
	return b.out(c, id, api.OpCopyOut, func(r *os.Root, w io.Writer) (archive.Receipt, error) {
		return archive.WriteTar(ctx, r, p, "", w)
	})
}

func (b *memBackend) out(c api.Caller, id, op string, f func(*os.Root, io.Writer) (archive.Receipt, error)) (io.ReadCloser, api.Receipt, error) {
	r, err := b.rootOf(c, id)
	if err != nil {
		return nil, api.Receipt{}, err
	}
	defer r.Close()
	var buf bytes.Buffer
	rc, err := f(r, &buf)
	if err != nil {
		return nil, api.Receipt{}, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	return io.NopCloser(&buf), api.Receipt{Computer: id, Op: op, SHA256: rc.SHA256, Bytes: rc.Bytes, Files: rc.Files}, nil
}

func (b *memBackend) CopyIn(ctx context.Context, c api.Caller, id, dir string, body io.Reader) (api.Receipt, error) {
	r, err := b.rootOf(c, id)
	if err != nil {
		return api.Receipt{}, err
	}
	defer r.Close()
	rc, err := archive.ExtractTar(ctx, body, r, dir, archive.CopyOptions{Owner: keep})
	if err != nil {
		return api.Receipt{}, api.Errorf(api.CodeConflict, "%v", err)
	}
	return api.Receipt{Computer: id, Op: api.OpCopyIn, Path: dir, SHA256: rc.SHA256, Bytes: rc.Bytes, Files: rc.Files}, nil
}

func (b *memBackend) Import(ctx context.Context, c api.Caller, req api.CreateRequest, body io.Reader, want string) (api.ImportResult, error) {
	data, err := io.ReadAll(body)
	if err != nil {
		return api.ImportResult{}, err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != want {
		return api.ImportResult{}, api.Errorf(api.CodeBadRequest, "the stream's SHA-256 is not %s", want)
	}
	comp, _ := b.Create(ctx, c, req)
	dir := filepath.Join(b.dir, comp.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return api.ImportResult{}, err
	}
	rc, err := archive.Import(ctx, bytes.NewReader(data), dir, archive.ImportOptions{SHA256: want, Owner: keep})
	if err != nil {
		return api.ImportResult{}, err
	}
	return api.ImportResult{Computer: comp, Receipt: api.Receipt{Computer: comp.ID, Op: api.OpImport, SHA256: rc.SHA256,
		Bytes: rc.Bytes, Files: rc.Files}}, nil
}

// serveMem serves a memBackend whose roots are folders of a temp dir on
// a unix socket, and returns the backend and the socket.
func serveMem(t *testing.T) (*memBackend, string) {
	t.Helper()
	be := &memBackend{cs: map[string]api.Computer{}, dir: t.TempDir()}
	srv, err := httpserver.New(httpserver.Config{Backend: be, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "api.sock")
	gid := uint32(os.Getgid())
	l, err := httpserver.ListenUnix(sock, httpserver.PeerPolicy{Group: &gid}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return be, sock
}

// makeProject writes a small project folder and returns its path.
func makeProject(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "proj")
	for name, body := range map[string]string{"README": "hello\n", "src/main.go": "package main\n", "src/deep/x.txt": "x"} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("src/main.go", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	return src
}

func receiptOf(t *testing.T, out string) api.Receipt {
	t.Helper()
	var r api.Receipt
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.SHA256) != 64 {
		t.Fatalf("receipt %q: %v", out, err)
	}
	return r
}

// TestCopyInAndOutCLI: cp of a folder (and of one file) in and out
// again gives the same tree and the same SHA-256 on both receipts; a second copy to the same
// place is refused (conflict) and leaves the first; a local destination
// that exists is refused.
func TestCopyInAndOutCLI(t *testing.T) {
	_, sock := serveMem(t)
	if code, _, errs := cmd(t, "create", "--socket", sock); code != 0 {
		t.Fatal(errs)
	}
	src := makeProject(t)
	code, out, errs := cmd(t, "cp", src, "cx:/work/proj", "--socket", sock)
	if code != 0 {
		t.Fatalf("cp in: %d %s", code, errs)
	}
	in := receiptOf(t, out)
	if in.Files != 7 || in.Op != api.OpCopyIn {
		t.Errorf("cp in receipt %+v, want 7 entries", in)
	}
	if code, _, errs := cmd(t, "cp", src, "cx:/work/proj", "--socket", sock); code != exitFail || !strings.Contains(errs, "conflict") {
		t.Errorf("a second cp to the same place: %d %q, want a conflict", code, errs)
	}
	dst := filepath.Join(t.TempDir(), "back")
	code, out, errs = cmd(t, "cp", "cx:/work/proj", dst, "--socket", sock)
	if code != 0 {
		t.Fatalf("cp out: %d %s", code, errs)
	}
	if back := receiptOf(t, out); back.SHA256 != in.SHA256 || back.Bytes != in.Bytes {
		t.Errorf("cp out receipt %+v, cp in %+v: want the same digest", back, in)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "src/deep/x.txt")); err != nil || string(b) != "x" {
		t.Errorf("copied out file: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "src/main.go" {
		t.Errorf("copied out symlink: %q %v", l, err)
	}
	if code, _, errs := cmd(t, "cp", "cx:/work/proj", dst, "--socket", sock); code != exitFail {
		t.Errorf("cp out over an existing folder: %d %q, want a refusal", code, errs)
	}
	code, out, errs = cmd(t, "cp", filepath.Join(src, "README"), "cx:/notes/readme.txt", "--socket", sock)
	if code != 0 {
		t.Fatalf("cp of one file in: %d %s", code, errs)
	}
	one := receiptOf(t, out)
	file := filepath.Join(t.TempDir(), "readme.txt")
	code, out, errs = cmd(t, "cp", "cx:/notes/readme.txt", file, "--socket", sock)
	if code != 0 {
		t.Fatalf("cp of one file out: %d %s", code, errs)
	}
	if r := receiptOf(t, out); r.SHA256 != one.SHA256 || one.Files != 1 {
		t.Errorf("one file: in %+v, out %+v; want one entry and the same digest", one, r)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "hello\n" {
		t.Errorf("the file copied out: %q %v", b, err)
	}
	if code, _, _ := cmd(t, "cp", src, dst, "--socket", sock); code != exitUsage {
		t.Errorf("cp with no remote side: exit %d, want %d", code, exitUsage)
	}
}

// TestExportImportCLI: export prints the SHA-256 of the file it wrote;
// import with it makes a computer holding the tree; import with a flipped
// digest is refused and makes nothing.
func TestExportImportCLI(t *testing.T) {
	be, sock := serveMem(t)
	code, out, errs := cmd(t, "create", "--socket", sock, "--seed", makeProject(t))
	if code != 0 || !strings.Contains(errs, "seeded cx: sha256 ") {
		t.Fatalf("create --seed: %d %q %q", code, out, errs)
	}
	file := filepath.Join(t.TempDir(), "cx.tar.zst")
	code, out, errs = cmd(t, "export", "cx", "-o", file, "--socket", sock)
	if code != 0 {
		t.Fatalf("export: %d %s", code, errs)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	if out != digest+"  "+file+"\n" {
		t.Errorf("export printed %q, want the file's SHA-256 %s", out, digest)
	}
	wrong := []byte(digest)
	wrong[0] ^= 1
	if code, _, errs := cmd(t, "import", file, "--sha256", string(wrong), "--socket", sock); code != exitFail || !strings.Contains(errs, "bad_request") {
		t.Errorf("import with a wrong digest: %d %q, want bad_request", code, errs)
	}
	if len(be.cs) != 1 {
		t.Errorf("a refused import left %d computers, want the 1 before it", len(be.cs))
	}
	code, out, errs = cmd(t, "import", file, "--sha256", digest, "--socket", sock)
	if code != 0 {
		t.Fatalf("import: %d %s", code, errs)
	}
	var res api.ImportResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Receipt.SHA256 != digest {
		t.Fatalf("import answered %q: %v", out, err)
	}
	if b, err := os.ReadFile(filepath.Join(be.dir, res.Computer.ID, "src/main.go")); err != nil || string(b) != "package main\n" {
		t.Errorf("imported file: %q %v", b, err)
	}
}

// TestCreateSeedBundle: create --seed-bundle clones the bundle locally
// and copies the clone (with its .git) into the new root.
func TestCreateSeedBundle(t *testing.T) {
	testenv.Require(t, "devtools")
	be, sock := serveMem(t)
	repo := makeProject(t)
	git := func(args ...string) {
		t.Helper()
		c := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.org"}, args...)...)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "--quiet")
	git("add", ".")
	git("commit", "--quiet", "-m", "first")
	bundle := filepath.Join(t.TempDir(), "proj.bundle")
	git("bundle", "create", bundle, "--all")
	code, _, errs := cmd(t, "create", "--socket", sock, "--seed-bundle", bundle)
	if code != 0 {
		t.Fatalf("create --seed-bundle: %d %s", code, errs)
	}
	for _, name := range []string{"README", "src/deep/x.txt", ".git/HEAD"} {
		if _, err := os.Stat(filepath.Join(be.dir, "cx", name)); err != nil {
			t.Errorf("the seeded root lacks %s: %v", name, err)
		}
	}
	if code, _, errs := cmd(t, "create", "--socket", sock, "--seed-bundle", filepath.Join(t.TempDir(), "none.bundle")); code != exitFail || len(be.cs) != 1 {
		t.Errorf("create with a missing bundle: %d %q, %d computers; want a failure and the new computer deleted", code, errs, len(be.cs))
	}
}

// TestCopyHelpSaysBothTiers: cp --help says a copy works for both tiers
// and how a VM computer's goes (through its guest).
func TestCopyHelpSaysBothTiers(t *testing.T) {
	code, out, errs := cmd(t, "cp", "--help")
	if help := out + errs; code != 0 || !strings.Contains(help, "Works for both tiers") || !strings.Contains(help, "through its guest") {
		t.Fatalf("cp --help: exit %d, %q", code, help)
	}
}
