package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/archive"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/computer/vm/image"
)

// A VM computer's export is its writable disk (computer/archive's disk
// export): the upper layer of its root over the guest image, named in
// the export by the image's digest. The host reads the disk as bytes
// only; it never mounts or parses the file system in it (an ext4 a guest
// wrote is untrusted input to the host's kernel). The identity injected
// at boot lives on a tmpfs in the guest (RootImage.Tmpfs), so an export
// carries no receiver key. An import boots a new computer cold on a
// copy of the disk (never from a saved state: the saved guest's memory
// holds another disk's file system).

var (
	_ api.DiskExporter = (*Machine)(nil)
	_ api.DiskImporter = (*Provisioner)(nil)
)

// syncGuest asks the guest to write what it holds of its file systems
// to its disks (ctl sync); a stopped guest has nothing in flight.
func (m *Machine) syncGuest(ctx context.Context) error {
	if m.isFrozen() || m.ctl == nil {
		return nil
	}
	if _, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpSync}); err != nil {
		return fmt.Errorf("sync the guest's disks: %w", err)
	}
	return nil
}

// ExportDisk implements api.DiskExporter for a frozen computer booted
// on the guest image: the disk (flattened from its qcow2 over a saved
// state's template disk by qemu-img, run as QEMU's uid) streamed as a
// disk export.
func (m *Machine) ExportDisk(ctx context.Context, w io.Writer) (api.Transfer, error) {
	if m.rootImg == nil {
		return api.Transfer{}, api.Errorf(api.CodeConflict, "this computer's root is a tmpfs in its guest's memory (no guest image): it has no disk to export")
	}
	if !m.isFrozen() {
		return api.Transfer{}, api.Errorf(api.CodeConflict, "export the disk of a stopped guest only (suspend it first)")
	}
	path := m.diskPath()
	if m.overlaid() {
		var err error
		if path, err = m.flatten(ctx); err != nil {
			return api.Transfer{}, err
		}
		defer os.Remove(path)
	}
	f, size, err := m.openQEMUFile(path)
	if err != nil {
		return api.Transfer{}, err
	}
	defer f.Close()
	rc, err := archive.ExportDisk(ctx, w, m.rootImg.Digest(), f, size)
	return api.Transfer{SHA256: rc.SHA256, Bytes: rc.Bytes, Files: rc.Files}, err
}

// openQEMUFile opens a file of QEMU's directory, which QEMU's uid may
// change: not through a symlink, and only a regular file of QEMU's uid
// with one link of exactly the disk limit's size (so not a link to a
// file of the host's, nor a disk grown beyond its limit).
func (m *Machine) openQEMUFile(path string) (*os.File, int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.Mode().IsRegular() || st.Uid != m.qemuUID || st.Nlink != 1 || fi.Size() != m.limits.DiskBytes {
		f.Close()
		return nil, 0, fmt.Errorf("%w: %s is not QEMU's disk of %d bytes (mode %v, uid %d, links %d, %d bytes)",
			ErrGuest, path, m.limits.DiskBytes, fi.Mode(), st.Uid, st.Nlink, fi.Size())
	}
	return f, fi.Size(), nil
}

// flatten writes the computer's qcow2 and its backing as one raw disk
// beside it and returns its path. qemu-img runs confined as QEMU, so it
// reads only what QEMU may, and is given the backing (overlayNode), not
// the qcow2 header's; -U: QEMU holds the images, stopped and flushed.
func (m *Machine) flatten(ctx context.Context) (string, error) {
	node := m.overlayNode()
	delete(node, "node-name")
	spec, err := json.Marshal(node)
	if err != nil {
		return "", err
	}
	out := filepath.Join(m.paths.qemu, "export.raw")
	os.Remove(out)
	cmd := exec.CommandContext(ctx, "qemu-img", "convert", "-U", "-O", "raw", "json:"+string(spec), out)
	cmd.SysProcAttr = m.confinement()
	cmd.Env = []string{}
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(out)
		return "", fmt.Errorf("qemu-img convert the disk: %w: %s", err, b)
	}
	return out, nil
}

// CheckDisk implements api.DiskImporter: the export r must be a layer
// of this provisioner's guest image and of a size it boots.
func (p *Provisioner) CheckDisk(ctx context.Context, r io.Reader, maxDiskBytes int64) (int64, error) {
	img, err := p.guestImage()
	if err != nil {
		return 0, err
	}
	man, _, err := archive.ReadDisk(ctx, r, archive.DiskOptions{MaxDiskBytes: maxDiskBytes, Check: diskCheck(img, 0)}, io.Discard)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", api.ErrBadDisk, err)
	}
	return man.DiskBytes, nil
}

// diskCheck refuses a disk export that is not a layer of img, or whose
// size is below MinDiskBytes or not size (when size is set).
func diskCheck(img *image.Image, size int64) func(archive.DiskManifest) error {
	return func(man archive.DiskManifest) error {
		switch {
		case img == nil:
			return errors.New("this host's VM computers boot no guest image, so no disk")
		case man.BaseImage != img.Digest():
			return fmt.Errorf("the disk is a layer of the image %s; this host boots %s", man.BaseImage, img.Digest())
		case man.DiskBytes < MinDiskBytes:
			return fmt.Errorf("disk of %d bytes is below a VM computer's floor of %d", man.DiskBytes, MinDiskBytes)
		case size != 0 && man.DiskBytes != size:
			return fmt.Errorf("disk of %d bytes; the computer's disk limit is %d", man.DiskBytes, size)
		}
		return nil
	}
}

// PrepareDisk implements api.DiskImporter: Prepare, booting cold on a
// writable disk read from the export r.
func (p *Provisioner) PrepareDisk(ctx context.Context, dir string, limits api.Limits, r io.Reader) (api.Machine, api.Transfer, error) {
	if limits.DiskBytes <= 0 {
		return nil, api.Transfer{}, fmt.Errorf("%w: an import names its disk's size", api.ErrBadDisk)
	}
	d, err := provision.CheckDir(dir)
	if err != nil {
		return nil, api.Transfer{}, err
	}
	m, err := p.prepareMachine(ctx, d, limits, false, r)
	if err != nil {
		return nil, api.Transfer{}, err
	}
	return m, m.imported, nil
}

// importDisk writes the export's disk as the computer's writable layer
// (sparse: runs of zeros are not written), QEMU's, before QEMU runs.
func (m *Machine) importDisk(ctx context.Context) error {
	if m.rootImg == nil {
		return fmt.Errorf("%w: this host's VM computers boot no guest image, so no disk", api.ErrBadDisk)
	}
	p := m.diskPath()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	man, rc, err := archive.ReadDisk(ctx, m.importFrom, archive.DiskOptions{MaxDiskBytes: m.limits.DiskBytes,
		Check: diskCheck(m.rootImg, m.limits.DiskBytes)}, &sparseWriter{f: f})
	if err != nil {
		return fmt.Errorf("%w: %w", api.ErrBadDisk, err)
	}
	if err := errors.Join(f.Truncate(man.DiskBytes), f.Sync(), f.Chown(int(m.qemuUID), int(m.qemuUID))); err != nil {
		return err
	}
	m.imported = api.Transfer{SHA256: rc.SHA256, Bytes: rc.Bytes, Files: rc.Files}
	return nil
}

// sparseWriter writes to f from offset 0 on, seeking over blocks of
// zeros (f is new, so they read as zeros; Truncate sets the end).
type sparseWriter struct {
	f   *os.File
	off int64
}

var zeroBlock = make([]byte, 64<<10)

func (w *sparseWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), len(zeroBlock))
		if !bytes.Equal(p[:k], zeroBlock[:k]) {
			if _, err := w.f.WriteAt(p[:k], w.off); err != nil {
				return n - len(p), err
			}
		}
		w.off += int64(k)
		p = p[k:]
	}
	return n, nil
}
