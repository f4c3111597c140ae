package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/tetherdev/tether/computer/vm/guest"
	"github.com/tetherdev/tether/computer/vm/image"
	"github.com/tetherdev/tether/computer/vm/vmguest"
)

// GuestImageOff as Config.GuestImage boots the initramfs alone even when
// a guest image was built.
const GuestImageOff = "off"

// DefaultDiskBytes is a VM computer's writable disk when the limits name
// none: a sparse file, so only what the guest writes takes host space.
const DefaultDiskBytes = 1 << 30

// MinDiskBytes is the smallest writable disk (ext4 needs room for its
// own metadata).
const MinDiskBytes = 8 << 20

// Virtio serial numbers of the two disks; the guest agent finds them by
// these (computer/vm/vmguest.RootImage).
const (
	baseSerial  = "tether-base"
	upperSerial = "tether-disk"
)

// imageModules are the guest modules the overlay root needs. ext4's
// checksums ask the crypto API for crc32c, which nothing would load on
// demand (the guest has no modprobe): it is named.
var imageModules = []string{"virtio_pci", "virtio_blk", "crc32c_generic", "ext4", "overlay"}

// imageOnce resolves Config.GuestImage once per provisioner: found and
// its digest verified against its manifest, or absent (the initramfs
// alone), or an error (an image that is there but does not verify).
type imageOnce struct {
	once sync.Once
	img  *image.Image
	err  error
}

// guestImage is the verified guest image, nil when none is used.
func (p *Provisioner) guestImage() (*image.Image, error) {
	o := &p.img
	o.once.Do(func() {
		dir, explicit := p.cfg.GuestImage, true
		switch dir {
		case GuestImageOff:
			return
		case "":
			dir, explicit = image.DefaultDir(), false
		}
		img, err := image.Load(dir)
		switch {
		case errors.Is(err, image.ErrAbsent) && !explicit:
			p.logf("vm: no guest image (%v); guests boot the initramfs alone", err)
		case err != nil:
			o.err = fmt.Errorf("%w: guest image: %w", ErrConfig, err)
		default:
			if strings.ContainsAny(img.Path, ",\n\x00") {
				o.err = fmt.Errorf("%w: guest image path %q holds a comma", ErrConfig, img.Path)
				return
			}
			o.img = &img
			p.logf("vm: guest image %s (%d packages)", img.Digest(), len(img.Manifest.Packages))
		}
	})
	return o.img, o.err
}

// chooseRoot decides whether this computer's root is the guest image
// (with a writable disk of the disk limit) or the initramfs. With a
// saved state (Config.StateDir) the disk is a copy-on-write layer over
// the slot's template disk (savedstate.go).
func (m *Machine) chooseRoot(context.Context) error {
	img, err := m.p.guestImage()
	if err != nil || img == nil {
		return err
	}
	if m.limits.DiskBytes == 0 {
		m.limits.DiskBytes = DefaultDiskBytes
	}
	if m.limits.DiskBytes < MinDiskBytes {
		return fmt.Errorf("%w: disk %d bytes is below a VM computer's floor of %d", ErrConfig, m.limits.DiskBytes, MinDiskBytes)
	}
	m.rootImg = img
	return nil
}

// diskPath is the computer's writable layer, QEMU's: a raw ext4, or a
// qcow2 over the saved state's template disk.
func (m *Machine) diskPath() string {
	if m.overlaid() {
		return filepath.Join(m.paths.qemu, "disk.qcow2")
	}
	return filepath.Join(m.paths.qemu, "disk.ext4")
}

// overlaid reports whether the writable layer is a copy-on-write disk
// over a saved state's template disk.
func (m *Machine) overlaid() bool { return m.rootImg != nil && m.saved != nil && m.saved.disk != "" }

// makeDisk makes the writable layer, owned by QEMU's uid, before QEMU
// runs: over a saved state, a qcow2 whose backing is the slot's disk;
// else a sparse file of the disk limit holding an empty ext4 (no
// journal: the layer lives as long as the computer).
func (m *Machine) makeDisk(ctx context.Context) error {
	switch {
	case m.importFrom != nil:
		return m.importDisk(ctx)
	case m.rootImg == nil:
		return nil
	case m.overlaid():
		return m.makeOverlay(ctx)
	}
	p := m.diskPath()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(m.limits.DiskBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
		"-E", "lazy_itable_init=0,nodiscard,root_owner=0:0", "-L", "tether-disk", p).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w: %s", p, err, out)
	}
	return os.Chown(p, int(m.qemuUID), int(m.qemuUID))
}

// diskArgs are the two virtio-blk disks: the base read-only (QEMU opens
// it read-only, so every computer shares the one file), the writable
// layer read-write (over a saved state: its backing pinned read-only,
// overlayArgs).
func (m *Machine) diskArgs() []string {
	if m.rootImg == nil {
		return nil
	}
	disk := []string{"-drive", "file=" + m.diskPath() + ",format=raw,if=none,id=tether-disk"}
	if m.overlaid() {
		disk = m.overlayArgs()
	}
	return append([]string{
		"-drive", "file=" + m.rootImg.Path + ",format=raw,if=none,id=tether-base,readonly=on",
		"-device", "virtio-blk-pci,drive=tether-base,serial=" + baseSerial},
		append(disk, "-device", "virtio-blk-pci,drive=tether-disk,serial="+upperSerial)...)
}

// rootImageConfig is the guest agent's RootImage: the disks, and the
// initramfs paths bound into the image's root (the agent, the receiver
// and the agent's configuration; the identity the host injects later is
// written into the new root).
func (m *Machine) rootImageConfig() *vmguest.RootImage { return rootImageFor(m.rootImg) }

// rootImageFor is the RootImage of a guest booting img (nil: none). It
// holds nothing of one computer, so a saved state's initramfs has it.
func rootImageFor(img *image.Image) *vmguest.RootImage {
	if img == nil {
		return nil
	}
	return &vmguest.RootImage{BaseSerial: baseSerial, UpperSerial: upperSerial,
		Binds: []string{guestAgentPath, guestReceiverPath, filepath.Dir(vmguest.ConfigPath), "/etc/hostname"},
		Tmpfs: []string{guestEtc}}
}

// guestModules are the modules a guest loads: the image's too when its
// root is the guest image.
func guestModules(root *vmguest.RootImage) []string {
	if root != nil {
		return append(append([]string{}, imageModules...), vmModules...)
	}
	return vmModules
}

// vmModules are the modules every guest loads: the virtio-serial ports.
var vmModules = guest.ModulesVirtioSerial

// tmpfsRootBytes is the size of the tmpfs mounted on the grant's root:
// none with a guest image (the root is on the writable disk).
func (m *Machine) tmpfsRootBytes() int64 {
	if m.rootImg != nil {
		return 0
	}
	return m.rootBytes()
}
