package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// tarOf is a tar of entries: a name ending in "/" a directory, a
// "name -> target" a symlink, else a file with its body.
func tarOf(t *testing.T, entries ...[2]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e[1]))}
		name, target, isLink := strings.Cut(e[0], " -> ")
		switch {
		case isLink:
			h.Name, h.Linkname, h.Typeflag, h.Size = name, target, tar.TypeSymlink, 0
		case strings.HasSuffix(e[0], "/"):
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e[1])); err != nil && !isLink {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// copyOutFile copies path out of computer id and returns the tar's one
// file's bytes, checking the receipt is of the stream received.
func copyOutFile(t *testing.T, ctx context.Context, s *service.Service, id, path string) []byte {
	t.Helper()
	rc, rec, err := s.CopyOut(ctx, api.Caller{Owner: "alice"}, id, path)
	if err != nil {
		t.Fatalf("copy out of %s: %v", path, err)
	}
	stream, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if h := sha256.Sum256(stream); hex.EncodeToString(h[:]) != rec.SHA256 || rec.Bytes != int64(len(stream)) || rec.Op != api.OpCopyOut {
		t.Fatalf("copy out receipt %+v for %d bytes", rec, len(stream))
	}
	tr := tar.NewReader(bytes.NewReader(stream))
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIntegrationVMCopy: copy in and out of a VM computer through the
// service go through its guest. A folder copied in is read by a command
// as the grant's uid, which owns it; a file copied out has its bytes;
// each receipt is of the stream the host sent or received. A tar with a
// "../" name, an absolute name or a file through a symlink out of the
// root is bad_request and leaves nothing in the root (positive control:
// the same tar minus the bad entry extracts); a copy out of "../" or of
// a host path is refused. A suspended computer's copies are conflict
// (its guest is stopped), and work again after resume. It reports the
// rate of a 16 MiB copy in and out under TCG.
func TestIntegrationVMCopy(t *testing.T) {
	testenv.Require(t, "root", "qemu", "guestimage")
	p, base := testProvisioner(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, _ := vmService(t, ctx, p, base, 0)
	alice := api.Caller{Owner: "alice"}
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 192 << 20, DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	d := dialerOf(t, c)

	in := tarOf(t, [2]string{"proj/", ""}, [2]string{"proj/a.txt", "alpha\n"}, [2]string{"proj/sub/", ""},
		[2]string{"proj/sub/b.txt", "beta\n"}, [2]string{"proj/ln -> a.txt", ""})
	rec, err := s.CopyIn(ctx, alice, c.ID, "/work", bytes.NewReader(in))
	if h := sha256.Sum256(in); err != nil || rec.SHA256 != hex.EncodeToString(h[:]) || rec.Bytes != int64(len(in)) || rec.Files != 5 {
		t.Fatalf("copy in: %+v %v", rec, err)
	}
	out := runVia(t, ctx, d, c.Tuple, "cd "+GuestRoot+"/work/proj && id -u && stat -c %u . a.txt sub/b.txt && cat ln sub/b.txt")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || lines[1] != lines[0] || lines[2] != lines[0] || lines[3] != lines[0] || lines[4] != "alpha" || lines[5] != "beta" {
		t.Fatalf("the grant's uid reads the copied folder as %q", out)
	}
	if b := copyOutFile(t, ctx, s, c.ID, "/work/proj/sub/b.txt"); string(b) != "beta\n" {
		t.Fatalf("copied out %q", b)
	}

	attacks(t, ctx, s, c)
	throughput(t, ctx, s, c)

	if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CopyIn(ctx, alice, c.ID, "/later", bytes.NewReader(in)); api.CodeOf(err) != api.CodeConflict {
		t.Errorf("copy in to a suspended VM computer: %v, want conflict", err)
	}
	if _, _, err := s.CopyOut(ctx, alice, c.ID, "/work/proj/a.txt"); api.CodeOf(err) != api.CodeConflict {
		t.Errorf("copy out of a suspended VM computer: %v, want conflict", err)
	}
	if _, err := s.Resume(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if b := copyOutFile(t, ctx, s, c.ID, "/work/proj/a.txt"); string(b) != "alpha\n" {
		t.Fatalf("after resume, copied out %q", b)
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
}

// attacks: escapes refused with nothing written, each with its control.
func attacks(t *testing.T, ctx context.Context, s *service.Service, c api.Computer) {
	t.Helper()
	alice, d := api.Caller{Owner: "alice"}, dialerOf(t, c)
	for i, bad := range [][][2]string{
		{{"../../../../etc/escaped", "x"}},
		{{"/etc/escaped", "x"}},
		{{"TOP/ln -> /etc", ""}, {"TOP/ln/escaped", "x"}},
	} {
		top := fmt.Sprintf("atk%d", i)
		good := [][2]string{{top + "/", ""}, {top + "/f", "fine"}}
		for j := range bad {
			bad[j][0] = strings.ReplaceAll(bad[j][0], "TOP", top)
		}
		before := runVia(t, ctx, d, c.Tuple, "ls -A "+GuestRoot)
		_, err := s.CopyIn(ctx, alice, c.ID, "/", bytes.NewReader(tarOf(t, append(append([][2]string{}, good...), bad...)...)))
		if api.CodeOf(err) != api.CodeBadRequest {
			t.Fatalf("a tar with %v: %v, want bad_request", bad, err)
		}
		if after := runVia(t, ctx, d, c.Tuple, "ls -A "+GuestRoot+"; ls /etc/escaped 2>&1"); !strings.HasPrefix(after, before) ||
			strings.Contains(after, top) || !strings.Contains(after, "No such file") {
			t.Fatalf("after the refused tar with %v the root and /etc hold %q (before %q)", bad, after, before)
		}
		if _, err := s.CopyIn(ctx, alice, c.ID, "/", bytes.NewReader(tarOf(t, good...))); err != nil {
			t.Fatalf("control: the tar without %v: %v", bad, err)
		}
	}
	for _, path := range []string{"/../etc/passwd", "/work/../../etc/passwd", "/etc/passwd"} {
		if _, _, err := s.CopyOut(ctx, alice, c.ID, path); api.CodeOf(err) != api.CodeBadRequest {
			t.Errorf("copy out of %s: %v, want bad_request", path, err)
		}
	}
}

// throughput copies 16 MiB of random bytes in and out and reports the
// rates; the bytes out are the bytes in.
func throughput(t *testing.T, ctx context.Context, s *service.Service, c api.Computer) {
	t.Helper()
	alice := api.Caller{Owner: "alice"}
	big := make([]byte, 16<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	in := tarOf(t, [2]string{"big.bin", string(big)})
	start := time.Now()
	if _, err := s.CopyIn(ctx, alice, c.ID, "/", bytes.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	inTook := time.Since(start)
	start = time.Now()
	got := copyOutFile(t, ctx, s, c.ID, "/big.bin")
	outTook := time.Since(start)
	if !bytes.Equal(got, big) {
		t.Fatalf("copied out %d bytes, not the 16 MiB copied in", len(got))
	}
	mib := float64(len(in)) / (1 << 20)
	t.Logf("BENCH copy of 16 MiB through the guest, TCG: in %s (%.1f MiB/s), out %s (%.1f MiB/s)",
		inTook.Round(time.Millisecond), mib/inTook.Seconds(), outTook.Round(time.Millisecond), mib/outTook.Seconds())
}
