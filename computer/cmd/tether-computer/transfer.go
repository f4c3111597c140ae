package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/archive"
	"github.com/tetherdev/tether/computer/client"
)

// idPattern is a computer id, as the API's document has it.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// remotePath splits "ID:/path" into the id and the path in the computer.
func remotePath(arg string) (id, p string, ok bool) {
	id, p, ok = strings.Cut(arg, ":")
	if !ok || !idPattern.MatchString(id) || !strings.HasPrefix(p, "/") {
		return "", "", false
	}
	return id, path.Clean(p), true
}

func runCopy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("cp", "cp [flags] SRC DST",
		"Copies a file or folder into or out of a computer, as docker cp does: one of SRC and DST is\n"+
			"ID:/path in the computer, the other a local path. DST must not exist; in the computer its\n"+
			"missing parents are made, locally its parent must exist. Symlinks are copied as symlinks.\n"+
			"Prints the receipt (JSON): the SHA-256 of the tar stream copied, checked on both ends.\n"+
			"Works for both tiers: a VM computer's copy goes through its guest (never its disk), and a\n"+
			"suspended one must be resumed first (conflict).", stderr)
	pos, code, done := parse(fs, args, stdout, 2)
	if done {
		return code
	}
	srcID, src, srcRemote := remotePath(pos[0])
	dstID, dst, dstRemote := remotePath(pos[1])
	if srcRemote == dstRemote {
		return cli.UsageError(stderr, fs.Name(), "exactly one of SRC and DST must be ID:/path")
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "cp", err)
	}
	var rec api.Receipt
	if dstRemote {
		rec, err = copyIn(ctx, cl, pos[0], dstID, dst)
	} else {
		rec, err = copyOut(ctx, cl, srcID, src, pos[1])
	}
	if err != nil {
		return fail(stderr, "cp", err)
	}
	return printJSON(stdout, rec)
}

// copyIn sends the local file or folder src to dst in computer id.
func copyIn(ctx context.Context, cl *client.Client, src, id, dst string) (api.Receipt, error) {
	if dst == "/" {
		return api.Receipt{}, errors.New("DST must be a path beneath / (to fill the root, use create --seed)")
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return api.Receipt{}, err
	}
	root, err := os.OpenRoot(filepath.Dir(abs))
	if err != nil {
		return api.Receipt{}, err
	}
	defer root.Close()
	return sendTar(ctx, cl, id, path.Dir(dst), root, filepath.Base(abs), path.Base(dst))
}

// sendTar streams src of root (renamed as) to beneath dir in computer
// id, and checks the daemon's receipt is of the bytes sent. The writing
// goroutine is joined before it returns.
func sendTar(ctx context.Context, cl *client.Client, id, dir string, root *os.Root, src, as string) (api.Receipt, error) {
	pr, pw := io.Pipe()
	sent := make(chan archive.Receipt, 1)
	go func() {
		rc, err := archive.WriteTar(ctx, root, src, as, pw)
		pw.CloseWithError(err)
		sent <- rc
	}()
	rec, err := cl.CopyIn(ctx, id, dir, pr)
	pr.CloseWithError(errors.Join(err, io.ErrClosedPipe))
	rc := <-sent
	if err != nil {
		return api.Receipt{}, err
	}
	if rec.SHA256 != rc.SHA256 || rec.Bytes != rc.Bytes {
		return rec, fmt.Errorf("the daemon's receipt (%s, %d bytes) is not of what was sent (%s, %d bytes)",
			rec.SHA256, rec.Bytes, rc.SHA256, rc.Bytes)
	}
	return rec, nil
}

// copyOut fetches src of computer id into the new local path dst: the
// stream is extracted (through archive's checks, as the caller) into a
// new folder beside dst, then renamed to dst without replacing anything.
func copyOut(ctx context.Context, cl *client.Client, id, src, dst string) (api.Receipt, error) {
	abs, err := filepath.Abs(dst)
	if err != nil {
		return api.Receipt{}, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(abs), ".tether-cp-")
	if err != nil {
		return api.Receipt{}, err
	}
	defer os.RemoveAll(tmp)
	root, err := os.OpenRoot(tmp)
	if err != nil {
		return api.Receipt{}, err
	}
	defer root.Close()
	pr, pw := io.Pipe()
	got := make(chan error, 1)
	go func() {
		_, err := cl.CopyOut(ctx, id, src, pw)
		pw.CloseWithError(err)
		got <- err
	}()
	rc, err := archive.ExtractTar(ctx, pr, root, "/", archive.CopyOptions{Owner: archive.Owner{UID: archive.Keep, GID: archive.Keep}})
	pr.CloseWithError(errors.Join(err, io.ErrClosedPipe))
	if gerr := <-got; gerr != nil {
		return api.Receipt{}, gerr
	}
	if err != nil {
		return api.Receipt{}, err
	}
	err = unix.Renameat2(unix.AT_FDCWD, filepath.Join(tmp, path.Base(src)), unix.AT_FDCWD, abs, unix.RENAME_NOREPLACE)
	if err != nil {
		return api.Receipt{}, fmt.Errorf("move the copy to %s: %w", dst, err)
	}
	return api.Receipt{Computer: id, Op: api.OpCopyOut, Path: src, SHA256: rc.SHA256, Bytes: rc.Bytes, Files: rc.Files,
		At: time.Now().UTC().Round(0)}, nil
}

func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("export", "export [flags] ID -o FILE",
		"Writes a suspended computer's root as a tar.zst stream to the new file FILE and prints its\n"+
			"SHA-256 as sha256sum does (a running computer is refused: suspend it first). The digest\n"+
			"the daemon announced is checked against the bytes received.", stderr)
	out := fs.String("o", "", "the new file to write; required")
	pos, code, done := parse(fs, args, stdout, 1)
	if done {
		return code
	}
	if *out == "" {
		return cli.UsageError(stderr, fs.Name(), "-o FILE is required")
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "export", err)
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail(stderr, "export", err)
	}
	st, err := cl.Export(ctx, pos[0], f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(*out)
		return fail(stderr, "export", err)
	}
	fmt.Fprintf(stdout, "%s  %s\n", st.SHA256, *out)
	return exitOK
}

func runImport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("import", "import [flags] FILE --sha256 HEX",
		"Makes a computer whose root is the export FILE, after the daemon checked its SHA-256 is HEX\n"+
			"(a mismatch creates nothing); with --tier vm, a VM computer on the disk export FILE of a VM\n"+
			"computer this daemon exported. Prints the computer and the import's receipt (JSON).", stderr)
	sum := fs.String("sha256", "", "the export's SHA-256, as export printed it; required")
	req := createFlags(fs)
	pos, code, done := parse(fs, args, stdout, 1)
	if done {
		return code
	}
	if *sum == "" {
		return cli.UsageError(stderr, fs.Name(), "--sha256 is required")
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "import", err)
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return fail(stderr, "import", err)
	}
	defer f.Close()
	res, err := cl.Import(ctx, f, *sum, req.request())
	if err != nil {
		return fail(stderr, "import", err)
	}
	return printJSON(stdout, res)
}

// seedRoot fills the root of the new computer id with the contents of
// the local folder dir, or of a clone of the git bundle bundle.
func seedRoot(ctx context.Context, cl *client.Client, id, dir, bundle string) (api.Receipt, error) {
	if bundle != "" {
		tmp, err := os.MkdirTemp("", "tether-seed-")
		if err != nil {
			return api.Receipt{}, err
		}
		defer os.RemoveAll(tmp)
		dir = filepath.Join(tmp, "repo")
		out, err := exec.CommandContext(ctx, "git", "clone", "--quiet", "--", bundle, dir).CombinedOutput()
		if err != nil {
			return api.Receipt{}, fmt.Errorf("git clone %s: %w: %s", bundle, err, strings.TrimSpace(string(out)))
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return api.Receipt{}, err
	}
	defer root.Close()
	return sendTar(ctx, cl, id, "/", root, ".", "")
}

// createOpts are the create flags import and create share.
type createOpts struct {
	mem, pids, disk    *int64
	lease, idle, queue *time.Duration
	tier               *string
}

func createFlags(fs *flag.FlagSet) *createOpts {
	return &createOpts{
		mem:   fs.Int64("memory", 0, "memory limit in bytes (0: the service default)"),
		pids:  fs.Int64("pids", 0, "process limit (0: the service default)"),
		disk:  fs.Int64("disk", 0, "disk size in bytes (0: the service default)"),
		lease: fs.Duration("ttl", 0, "lease, whole seconds (0: the service default)"),
		idle:  fs.Duration("idle", 0, "suspend after this long idle (0: the default, 15m)"),
		queue: fs.Duration("queue-timeout", 0, "how long to wait in the queue (0: the service default)"),
		tier:  fs.String("tier", "", "namespaced (default) or vm: a QEMU guest with its own kernel, if the service offers it"),
	}
}

func (o *createOpts) request() api.CreateRequest {
	return api.CreateRequest{Limits: api.Limits{MemoryBytes: *o.mem, Pids: *o.pids, DiskBytes: *o.disk},
		LeaseTTLSeconds: seconds(*o.lease), IdleTimeoutSeconds: seconds(*o.idle), QueueTimeoutSeconds: seconds(*o.queue),
		Tier: *o.tier}
}

func touchOne(ctx context.Context, cl *client.Client, id string, stdout io.Writer) error {
	comp, err := cl.Touch(ctx, id)
	if err == nil {
		printJSON(stdout, comp)
	}
	return err
}

func receiptsOf(ctx context.Context, cl *client.Client, id string, stdout io.Writer) error {
	rs, err := cl.Receipts(ctx, id)
	if err == nil {
		printJSON(stdout, api.ReceiptList{Receipts: rs})
	}
	return err
}
