package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/archive"
)

// Transfers: export, import, copy in and out. Each runs under the
// computer's op lock (no transition interleaves, so teardown never meets
// an open file in the root), with a context that ends at the lease's end
// (an expiry waits for the transfer at most until the archive's next
// entry); no network read or write happens under the lock. What leaves the service (an export, a copy out) is written
// whole to a spool file first, so its receipt is known before the first
// byte is sent; an import is spooled whole and its digest checked before
// anything is created. Spool files live in Dir/spool (0700) and have no
// name (O_TMPFILE; elsewhere they are unlinked as soon as they are made),
// so nothing is left after a crash.
// Every receipt is kept in the store's receipts bucket (Receipts).

// SpoolDir is the directory of Config.Dir that holds spool files.
const SpoolDir = "spool"

// TouchAs records activity on a computer the caller may see, resuming
// it first when it is suspended (Touch).
func (s *Service) TouchAs(ctx context.Context, caller api.Caller, id string) (api.Computer, error) {
	c, err := s.lookup(caller, id)
	if err != nil {
		return api.Computer{}, err
	}
	if err := s.Touch(ctx, id); err != nil {
		return api.Computer{}, err
	}
	return s.viewOf(c), nil
}

// Export writes the root of a suspended computer as a tar.zst stream to
// a spool file and returns it, at its start, with the receipt; a
// machine that is an api.DiskExporter (a VM computer) writes its disk
// export instead. A running computer is refused (conflict): suspend it
// first, so no command changes a file while it is read. The caller
// closes the stream.
func (s *Service) Export(ctx context.Context, caller api.Caller, id string) (io.ReadCloser, api.Receipt, error) {
	return s.outMachine(ctx, caller, id, api.OpExport, "", []string{api.StateSuspended},
		func(ctx context.Context, m api.Machine, w io.Writer) (archive.Receipt, error) {
			if de, ok := m.(api.DiskExporter); ok {
				t, err := de.ExportDisk(ctx, w)
				return archive.Receipt{SHA256: t.SHA256, Bytes: t.Bytes, Files: t.Files}, err
			}
			var rc archive.Receipt
			err := withRoot(ctx, m, func(ctx context.Context, root *os.Root, _ archive.Owner) error {
				var err error
				rc, err = archive.Export(ctx, root, w)
				return err
			})
			return rc, err
		})
}

// CopyOut writes path of a running or suspended computer's root as a
// tar stream (its one top entry named path's last element) to a spool
// file and returns it, at its start, with the receipt. A machine that
// is an api.GuestCopier (a VM computer) has its guest write the tar,
// and a suspended one refuses (conflict: its guest is stopped). The
// caller closes the stream.
func (s *Service) CopyOut(ctx context.Context, caller api.Caller, id, path string) (io.ReadCloser, api.Receipt, error) {
	return s.outMachine(ctx, caller, id, api.OpCopyOut, path, []string{api.StateRunning, api.StateSuspended},
		func(ctx context.Context, m api.Machine, w io.Writer) (archive.Receipt, error) {
			if gc, ok := m.(api.GuestCopier); ok {
				t, err := gc.CopyOut(ctx, path, w)
				return archive.Receipt{SHA256: t.SHA256, Bytes: t.Bytes, Files: t.Files}, err
			}
			var rc archive.Receipt
			err := withRoot(ctx, m, func(ctx context.Context, root *os.Root, _ archive.Owner) error {
				var err error
				rc, err = archive.WriteTar(ctx, root, path, "", w)
				return err
			})
			return rc, err
		})
}

// outMachine runs write into a spool file on id's machine and keeps
// the receipt.
func (s *Service) outMachine(ctx context.Context, caller api.Caller, id, op, path string, states []string,
	write func(context.Context, api.Machine, io.Writer) (archive.Receipt, error)) (io.ReadCloser, api.Receipt, error) {
	f, err := s.spool()
	if err != nil {
		return nil, api.Receipt{}, err
	}
	var rc archive.Receipt
	err = s.onMachine(ctx, caller, id, states, func(ctx context.Context, m api.Machine) error {
		var err error
		rc, err = write(ctx, m, f)
		return err
	})
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, api.Receipt{}, transferError(op, err)
	}
	rec, err := s.keep(id, op, path, rc)
	if err != nil {
		f.Close()
		return nil, api.Receipt{}, err
	}
	return f, rec, nil
}

// CopyIn spools the tar stream r, then extracts it beneath the
// directory dir of a running or suspended computer's root
// (archive.ExtractTar: every top name must be new; what is written
// belongs to the computer's uid and gid), and keeps the receipt. A
// machine that is an api.GuestCopier (a VM computer) has its guest
// extract the stream, and a suspended one refuses (conflict).
func (s *Service) CopyIn(ctx context.Context, caller api.Caller, id, dir string, r io.Reader) (api.Receipt, error) {
	if _, err := s.lookup(caller, id); err != nil {
		return api.Receipt{}, err
	}
	// The body is spooled before the lock is taken: a slow client must
	// not hold the computer's lock, which its expiry waits for.
	f, err := s.spool()
	if err != nil {
		return api.Receipt{}, err
	}
	defer f.Close()
	if _, err := io.Copy(f, r); err != nil {
		return api.Receipt{}, &wrapped{api.Errorf(api.CodeBadRequest, "read the stream: %v", err), err}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return api.Receipt{}, internal("rewind the spool file", err)
	}
	var rc archive.Receipt
	err = s.onMachine(ctx, caller, id, []string{api.StateRunning, api.StateSuspended},
		func(ctx context.Context, m api.Machine) error {
			if gc, ok := m.(api.GuestCopier); ok {
				t, err := gc.CopyIn(ctx, dir, f)
				rc = archive.Receipt{SHA256: t.SHA256, Bytes: t.Bytes, Files: t.Files}
				return err
			}
			return withRoot(ctx, m, func(ctx context.Context, root *os.Root, own archive.Owner) error {
				var err error
				rc, err = archive.ExtractTar(ctx, f, root, dir, archive.CopyOptions{Owner: own})
				return err
			})
		})
	if err != nil {
		return api.Receipt{}, transferError(api.OpCopyIn, err)
	}
	return s.keep(id, api.OpCopyIn, dir, rc)
}

// Import spools r and checks its SHA-256 is want before anything is
// made: a mismatch is bad_request and creates nothing. Then it creates a
// computer as Create does (queue, capacity, quota), imports the spooled
// stream into its empty root (owned by the new computer's uid and gid)
// before the grant is published, and keeps the receipt. Into a tier
// whose provisioner is an api.DiskImporter (vm) the stream is a disk
// export instead (importDisk).
func (s *Service) Import(ctx context.Context, caller api.Caller, req api.CreateRequest, r io.Reader, want string) (api.ImportResult, error) {
	if !isDigest(want) {
		return api.ImportResult{}, api.Errorf(api.CodeBadRequest, "sha256 %q is not 64 lowercase hex digits", want)
	}
	di, err := s.diskTier(req.Tier)
	if err != nil {
		return api.ImportResult{}, err
	}
	f, err := s.spool()
	if err != nil {
		return api.ImportResult{}, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), r); err != nil {
		return api.ImportResult{}, &wrapped{api.Errorf(api.CodeBadRequest, "read the stream: %v", err), err}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return api.ImportResult{}, api.Errorf(api.CodeBadRequest,
			"%v: the stream's is %s, not %s; nothing was created", archive.ErrDigestMismatch, got, want)
	}
	if di != nil {
		return s.importDisk(ctx, caller, req, f, di, want)
	}
	var rc archive.Receipt
	seed := func(ctx context.Context, m api.Machine) error {
		rt, ok := m.(api.Rooted)
		if !ok {
			return errors.New("the machine has no root this service can reach")
		}
		dir, uid, gid := rt.Root()
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		var err error
		rc, err = archive.Import(ctx, f, dir, archive.ImportOptions{SHA256: want, Owner: archive.Owner{UID: uid, GID: gid}})
		return err
	}
	comp, err := s.create(ctx, caller, req, creation{seed: seed})
	if err != nil {
		return api.ImportResult{}, err
	}
	rec, err := s.keep(comp.ID, api.OpImport, "", rc)
	return api.ImportResult{Computer: comp, Receipt: rec}, err
}

// diskTier is the DiskImporter of an import's tier, nil for the default
// tier (a tar.zst of files); any other tier is refused (bad_request)
// before anything is read or made.
func (s *Service) diskTier(tier string) (api.DiskImporter, error) {
	if err := rootedTier(tier); err == nil {
		return nil, nil
	}
	if t, err := s.tierOf(tier); err == nil {
		if di, ok := s.provFor(t).(api.DiskImporter); ok {
			return di, nil
		}
	}
	return nil, rootedTier(tier)
}

// importDisk makes a computer of di's tier from the disk export in f
// (spooled, its digest want checked): the export is checked whole first
// (CheckDisk: a refusal is bad_request and nothing is made), it must be
// one this service exported (its receipts hold want: the guest's kernel
// mounts the disk's file system, which the importer could otherwise
// have crafted against it), the request's disk limit is its disk's size
// (another is refused), then the machine is prepared on the disk.
func (s *Service) importDisk(ctx context.Context, caller api.Caller, req api.CreateRequest, f *os.File, di api.DiskImporter, want string) (api.ImportResult, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return api.ImportResult{}, internal("rewind the spool file", err)
	}
	n, err := di.CheckDisk(ctx, f, s.cfg.MaxLimits.DiskBytes)
	if errors.Is(err, api.ErrBadDisk) {
		return api.ImportResult{}, &wrapped{api.Errorf(api.CodeBadRequest, "import: %v; nothing was created", err), err}
	}
	if err != nil {
		return api.ImportResult{}, internal("check the disk export", err)
	}
	switch req.Limits.DiskBytes {
	case 0:
		req.Limits.DiskBytes = n
	case n:
	default:
		return api.ImportResult{}, api.Errorf(api.CodeBadRequest,
			"import: limits.disk_bytes %d is not the exported disk's %d; nothing was created", req.Limits.DiskBytes, n)
	}
	ours, err := s.st.exported(want)
	if err != nil {
		return api.ImportResult{}, internal("read the receipts", err)
	}
	if !ours {
		return api.ImportResult{}, api.Errorf(api.CodeBadRequest,
			"import: the disk export %s is not one this service exported (no export receipt names it); nothing was created", want)
	}
	var tr api.Transfer
	prepare := func(ctx context.Context, dir string, l api.Limits) (api.Machine, error) {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		m, t, err := di.PrepareDisk(ctx, dir, l, f)
		tr = t
		return m, err
	}
	comp, err := s.create(ctx, caller, req, creation{prepare: prepare})
	if err != nil {
		return api.ImportResult{}, err
	}
	rec, err := s.keep(comp.ID, api.OpImport, "", archive.Receipt{SHA256: tr.SHA256, Bytes: tr.Bytes, Files: tr.Files})
	return api.ImportResult{Computer: comp, Receipt: rec}, err
}

// Receipts returns the receipts of computer id, oldest first.
func (s *Service) Receipts(ctx context.Context, caller api.Caller, id string) ([]api.Receipt, error) {
	if _, err := s.lookup(caller, id); err != nil {
		return nil, err
	}
	rs, err := s.st.receipts(id)
	if err != nil {
		return nil, internal("read receipts", err)
	}
	return rs, nil
}

// onMachine runs f on id's machine under c.op, while the computer is in
// one of states, with ctx ending at the lease's end.
func (s *Service) onMachine(ctx context.Context, caller api.Caller, id string, states []string,
	f func(context.Context, api.Machine) error) error {
	c, err := s.lookup(caller, id)
	if err != nil {
		return err
	}
	c.op.Lock()
	defer c.op.Unlock()
	if st := s.stateOf(c); !slices.Contains(states, st) || c.m == nil {
		return api.Errorf(api.CodeConflict, "computer %s is %s, want %s", id, st, strings.Join(states, " or "))
	}
	s.mu.Lock()
	deadline := c.deadline
	s.mu.Unlock()
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return f(ctx, c.m)
}

// withRoot runs f on m's root, opened as an os.Root; a machine whose
// root the service does not reach on the host (a VM computer's is in
// its guest: its copies go through the guest, api.GuestCopier) is
// refused with conflict.
func withRoot(ctx context.Context, m api.Machine, f func(context.Context, *os.Root, archive.Owner) error) error {
	rt, ok := m.(api.Rooted)
	if !ok {
		return api.Errorf(api.CodeConflict, "this computer's root is in its guest, which the service does not reach "+
			"on the host (export gives its disk)")
	}
	dir, uid, gid := rt.Root()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return internal("open the root", err)
	}
	defer root.Close()
	return f(ctx, root, archive.Owner{UID: uid, GID: gid})
}

// keep records a receipt in the store and returns it.
func (s *Service) keep(id, op, path string, rc archive.Receipt) (api.Receipt, error) {
	r := api.Receipt{Computer: id, Op: op, Path: path, SHA256: rc.SHA256, Bytes: rc.Bytes, Files: rc.Files,
		Skipped: rc.Skipped, At: time.Now().UTC().Round(0)}
	if err := s.st.putReceipt(r); err != nil {
		return api.Receipt{}, internal("record the receipt", err)
	}
	return r, nil
}

// spool returns a new read-write file without a name in Dir/spool. The
// caller closes it.
func (s *Service) spool() (*os.File, error) {
	dir := filepath.Join(s.cfg.Dir, SpoolDir)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, internal("spool directory", err)
	}
	// O_TMPFILE: the file never has a name, so a crash leaves nothing.
	if f, err := os.OpenFile(dir, os.O_RDWR|unix.O_TMPFILE, 0o600); err == nil {
		return f, nil
	}
	f, err := os.CreateTemp(dir, "spool-") // a file system without O_TMPFILE
	if err != nil {
		return nil, internal("spool file", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, internal("unlink the spool file", err)
	}
	return f, nil
}

// transferError gives a transfer's failure its code: an *api.Error
// keeps its own; an unsafe entry, a bad path or a digest mismatch is
// bad_request, a cap too_large, an existing name conflict. The cause is
// kept for errors.Is and errors.As.
func transferError(op string, err error) error {
	var coded *api.Error
	if errors.As(err, &coded) {
		return err
	}
	code := api.CodeInternal
	switch {
	case errors.Is(err, archive.ErrUnsafeEntry), errors.Is(err, archive.ErrDigestMismatch), errors.Is(err, fs.ErrNotExist):
		code = api.CodeBadRequest
	case errors.Is(err, archive.ErrTooLarge):
		code = api.CodeTooLarge
	case errors.Is(err, archive.ErrNotEmpty), errors.Is(err, fs.ErrExist):
		code = api.CodeConflict
	}
	return &wrapped{api.Errorf(code, "%s: %v", op, err), err}
}

// seedFailed is the answer of a create whose seed failed: the seed's
// own code when it has one (an unsafe archive is bad_request), else the
// create's failure.
func seedFailed(seedErr, createErr error) error {
	e := transferError(api.OpImport, seedErr)
	if api.CodeOf(e) == api.CodeInternal {
		return createErr
	}
	return fmt.Errorf("%w (the computer failed and was torn down)", e)
}

// isDigest reports whether d is 64 lowercase hex digits.
func isDigest(d string) bool {
	if len(d) != 2*sha256.Size {
		return false
	}
	for _, c := range d {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
