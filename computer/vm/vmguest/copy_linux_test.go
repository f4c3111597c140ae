package vmguest

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// tarEntry is one entry of a test tar: a directory (name ends in "/"),
// a symlink (link set) or a regular file.
type tarEntry struct{ name, body, link string }

func makeTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		case e.name[len(e.name)-1] == '/':
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// copyAgent is an agent whose grant root is a new directory, owned by
// uid and gid 60001 as the guest makes it.
func copyAgent(t *testing.T) *agent {
	t.Helper()
	testenv.Require(t, "root")
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(root, 60001, 60001); err != nil {
		t.Fatal(err)
	}
	return &agent{cfg: Config{Root: root, UID: 60001, GID: 60001}}
}

// testCopyIn sends data as the host does, in two chunks, and returns the
// end's answer (or the first failure's).
func (a *agent) testCopyIn(dir string, data []byte) ctl.Response {
	if r := a.handle(ctl.Request{Op: ctl.OpCopyInBegin, Path: dir}); r.Error != "" {
		return r
	}
	for _, c := range [][]byte{data[:len(data)/2], data[len(data)/2:]} {
		if r := a.handle(ctl.Request{Op: ctl.OpCopyInData, Data: c}); r.Error != "" {
			return r
		}
	}
	return a.handle(ctl.Request{Op: ctl.OpCopyInEnd})
}

// testCopyOut takes the tar of path as the host does.
func (a *agent) testCopyOut(path string) ([]byte, ctl.Response) {
	if r := a.handle(ctl.Request{Op: ctl.OpCopyOutBegin, Path: path}); r.Error != "" {
		return nil, r
	}
	var out []byte
	for {
		r := a.handle(ctl.Request{Op: ctl.OpCopyOutData})
		if r.Error != "" || r.Done {
			return out, r
		}
		out = append(out, r.Data...)
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range des {
		names = append(names, d.Name())
	}
	return names
}

// TestAgentCopyRoundTrip: a tar copied in is extracted beneath the
// directory named, every file the grant's; the tar of a file copied out
// holds its bytes.
func TestAgentCopyRoundTrip(t *testing.T) {
	a := copyAgent(t)
	in := makeTar(t, tarEntry{name: "proj/"}, tarEntry{name: "proj/a.txt", body: "alpha\n"})
	if r := a.testCopyIn("work", in); r.Error != "" || r.Files != 2 {
		t.Fatalf("copy in: %+v", r)
	}
	for _, p := range []string{"work", "work/proj", "work/proj/a.txt"} {
		fi, err := os.Lstat(filepath.Join(a.cfg.Root, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 60001 || st.Gid != 60001 {
			t.Errorf("%s is %d:%d, want the grant's 60001:60001", p, st.Uid, st.Gid)
		}
	}
	out, r := a.testCopyOut("work/proj/a.txt")
	if r.Error != "" || !r.Done || r.Files != 1 {
		t.Fatalf("copy out: %+v", r)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(tr)
	if h.Name != "a.txt" || string(body) != "alpha\n" {
		t.Fatalf("copy out gave %q: %q", h.Name, body)
	}
	if r := a.testCopyIn("work", in); r.Refused != ctl.RefusedNotNew {
		t.Fatalf("a second copy of the same top name: %+v, want refused %q", r, ctl.RefusedNotNew)
	}
}

// TestAgentCopyInRefusesEscapes: a tar with a "../" name, an absolute
// name, or a file through a symlink out of the root is refused and
// nothing is left in the root; positive control: the same tar minus the
// bad entry extracts.
func TestAgentCopyInRefusesEscapes(t *testing.T) {
	good := []tarEntry{{name: "ok/"}, {name: "ok/f", body: "fine"}}
	outside := t.TempDir()
	for name, bad := range map[string][]tarEntry{
		"dot-dot":        {{name: "ok/../../escaped", body: "x"}},
		"absolute":       {{name: outside + "/abs", body: "x"}},
		"symlink escape": {{name: "ok/ln", link: outside}, {name: "ok/ln/through", body: "x"}},
	} {
		t.Run(name, func(t *testing.T) {
			a := copyAgent(t)
			r := a.testCopyIn("", makeTar(t, append(append([]tarEntry{}, good...), bad...)...))
			if r.Error == "" {
				t.Fatalf("the tar with %v extracted: %+v", bad, r)
			}
			t.Logf("refused: %s (%s)", r.Error, r.Refused)
			if left := entries(t, a.cfg.Root); len(left) != 0 {
				t.Fatalf("the refused copy left %v in the root", left)
			}
			if left := entries(t, outside); len(left) != 0 {
				t.Fatalf("the refused copy wrote %v outside the root", left)
			}
			if r := a.testCopyIn("", makeTar(t, good...)); r.Error != "" || r.Files != 2 {
				t.Fatalf("control: the tar without the bad entry: %+v", r)
			}
		})
	}
}

// TestAgentCopyOutStaysInRoot: a path with ".." is refused, an absolute
// path is the root's own (missing here: ENOENT, not the host's file),
// and a symlink to a file outside goes out as a symlink, never its
// content; positive control: a file of the root goes out.
func TestAgentCopyOutStaysInRoot(t *testing.T) {
	a := copyAgent(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(a.cfg.Root, "ln")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.cfg.Root, "mine"), []byte("MINE"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, r := a.testCopyOut("../" + filepath.Base(filepath.Dir(secret)) + "/secret"); r.Refused != ctl.RefusedUnsafe {
		t.Errorf("copy out of ../: %+v, want refused %q", r, ctl.RefusedUnsafe)
	}
	if _, r := a.testCopyOut(secret); r.ErrNo != "ENOENT" {
		t.Errorf("copy out of %s: %+v, want ENOENT in the root", secret, r)
	}
	out, r := a.testCopyOut("ln")
	if r.Error != "" || bytes.Contains(out, []byte("SECRET")) {
		t.Errorf("copy out of a symlink: %+v, holds the target's bytes: %v", r, bytes.Contains(out, []byte("SECRET")))
	}
	if out, r := a.testCopyOut("mine"); r.Error != "" || !bytes.Contains(out, []byte("MINE")) {
		t.Errorf("control: copy out of a file of the root: %+v", r)
	}
}

// TestAgentCopyAbortUndoes: a copy in the host aborts after its first
// chunk leaves nothing; a begin ends the copy before it the same way;
// data without a begin is refused.
func TestAgentCopyAbortUndoes(t *testing.T) {
	a := copyAgent(t)
	big := makeTar(t, tarEntry{name: "d/"}, tarEntry{name: "d/big", body: string(bytes.Repeat([]byte("b"), 64<<10))})
	for _, end := range []ctl.Request{{Op: ctl.OpCopyAbort}, {Op: ctl.OpCopyOutBegin, Path: "."}} {
		if r := a.handle(ctl.Request{Op: ctl.OpCopyInBegin}); r.Error != "" {
			t.Fatal(r.Error)
		}
		if r := a.handle(ctl.Request{Op: ctl.OpCopyInData, Data: big[:len(big)/2]}); r.Error != "" {
			t.Fatal(r.Error)
		}
		a.handle(end)
		a.handle(ctl.Request{Op: ctl.OpCopyAbort})
		if left := entries(t, a.cfg.Root); len(left) != 0 {
			t.Fatalf("after %s the root holds %v", end.Op, left)
		}
	}
	if r := a.handle(ctl.Request{Op: ctl.OpCopyInData, Data: []byte("x")}); r.Error == "" {
		t.Fatal("copy_in_data without a begin was taken")
	}
	if r := a.testCopyIn("", big); r.Error != "" {
		t.Fatalf("control: the whole tar: %+v", r)
	}
}

// TestAgentCopyNeedsIdentity: a guest waiting for its identity (a
// restored one) refuses every copy op but abort, so nothing is written
// as uid 0; positive control: with the identity the same begin is taken.
func TestAgentCopyNeedsIdentity(t *testing.T) {
	a := copyAgent(t)
	a.cfg.AwaitIdentity, a.cfg.UID, a.cfg.GID = true, 0, 0
	for _, req := range []ctl.Request{{Op: ctl.OpCopyInBegin}, {Op: ctl.OpCopyInData, Data: []byte("x")}, {Op: ctl.OpCopyInEnd},
		{Op: ctl.OpCopyOutBegin, Path: "."}, {Op: ctl.OpCopyOutData}} {
		if r := a.handle(req); r.Error == "" {
			t.Errorf("%s before the identity was taken: %+v", req.Op, r)
		}
	}
	a.cfg.UID, a.cfg.GID = 60001, 60001
	if r := a.handle(ctl.Request{Op: ctl.OpCopyInBegin}); r.Error != "" {
		t.Fatalf("control: begin with the identity: %s", r.Error)
	}
	a.handle(ctl.Request{Op: ctl.OpCopyAbort})
}

// TestAgentCopyEndsWhenTheHostGoes: a host that goes (the control port
// reads end-of-file) in the middle of a copy in leaves nothing: the
// agent aborts the copy, and its extraction undoes what it made.
// Positive control: before the host went, the half-sent copy had made
// its folder.
func TestAgentCopyEndsWhenTheHostGoes(t *testing.T) {
	a := copyAgent(t)
	host, guest := net.Pipe()
	served := make(chan bool, 1)
	go func() {
		again, _ := serveOnce(guest, a.handle, a.copyAbort)
		served <- again
	}()
	c := ctl.NewClient(host)
	big := makeTar(t, tarEntry{name: "d/"}, tarEntry{name: "d/big", body: string(bytes.Repeat([]byte("b"), 64<<10))})
	ctx := context.Background()
	if _, err := c.Call(ctx, ctl.Request{Op: ctl.OpCopyInBegin}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, ctl.Request{Op: ctl.OpCopyInData, Data: big[:len(big)/2]}); err != nil {
		t.Fatal(err)
	}
	if left := entries(t, a.cfg.Root); len(left) != 1 || left[0] != "d" {
		t.Fatalf("control: the half-sent copy made %v", left)
	}
	c.Close()
	if again := <-served; !again {
		t.Fatal("end-of-file ended the agent's serving")
	}
	if a.copy != nil {
		t.Fatal("the copy is still in progress")
	}
	if left := entries(t, a.cfg.Root); len(left) != 0 {
		t.Fatalf("after the host went the root holds %v", left)
	}
}
