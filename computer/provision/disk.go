package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A namespaced computer has its own file system of the grant's
// max_disk_bytes, mounted on DIR/disk on the host (root's, 0700). It
// holds two directories: project, bound at the tuple root DIR/root (so
// the host-side Stat and ReadFile see what the computer sees, and the
// stage binds it at the same path), and home, which the stage binds at
// Home; both belong to the grant's uid, 0700. The project and the home
// share the one bound: writes past it fail with ENOSPC and never fill
// the host's file system, and nothing written to the home lands in the
// project folder. It is an ext4 image on a loop device, the image's
// blocks reserved on the host up front (fallocate), so a host that runs
// short of space fails the allocation instead of the computer's writes;
// a computer below tinyDisk gets a tmpfs instead (its pages are charged
// to the commands' memory limit), with the same two directories.

// Disk is where a computer's root file system lives.
type Disk struct {
	// Kind is DiskExt4 or DiskTmpfs.
	Kind string `json:"kind"`
	// Image is the ext4 image (DIR/disk.img); Loop the loop device it
	// was attached to (/dev/loopN), released when the root is unmounted.
	Image string `json:"image,omitempty"`
	Loop  string `json:"loop,omitempty"`
}

// Disk kinds.
const (
	DiskExt4  = "ext4"
	DiskTmpfs = "tmpfs"
)

// tinyDisk is the size below which a computer's disk is a tmpfs.
const tinyDisk = 32 << 20

// ext4Options are the mount options of a computer's ext4 disk.
// noinit_itable keeps the kernel's lazy inode-table init from zeroing
// the tables after mount: on a loop device that zeroing punches holes
// in the image and hands the host back space fallocate reserved (about
// 4 MiB of a 64 MiB disk, up to 32 MiB of a 2 GiB one), so a host short
// of space could later fail the computer's writes. The image was
// fallocated, so the tables already read as zeros.
const ext4Options = "noinit_itable"

// loopName is the form of a loop device's path.
var loopName = regexp.MustCompile(`^/dev/loop[0-9]{1,6}$`)

// makeDisk gives a namespaced computer its own file system on DIR/disk,
// records it in the state, and binds its project directory at the
// tuple root.
func (c *Local) makeDisk(ctx context.Context) error {
	if !c.state.namespaced() {
		return nil
	}
	p, s := c.paths, c.state
	if err := os.Mkdir(p.diskDir, 0o700); err != nil {
		return err
	}
	if err := c.mountDisk(ctx); err != nil {
		return err
	}
	if err := MakeDirs(Dir{Path: p.diskDir, Mode: 0o700}, Dir{Path: p.diskProject, Mode: 0o700, UID: s.UID, GID: s.GID},
		Dir{Path: p.diskHome, Mode: 0o700, UID: s.UID, GID: s.GID}); err != nil {
		return err
	}
	if err := sharedMountpoint(p.root); err != nil {
		return err
	}
	// The bind joins the disk mount's peer group (a bind of a shared
	// mount does); teardown unmounts it before the disk.
	if err := unix.Mount(p.diskProject, p.root, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the disk's project at the tuple root: %w", err)
	}
	return nil
}

// mountDisk mounts the computer's file system on DIR/disk: a tmpfs below
// tinyDisk, else an ext4 image on a loop device. Each is recorded in the
// state before it is mounted. Its root is root's; mkfs's lost+found
// stays there, beside project and home.
func (c *Local) mountDisk(ctx context.Context) error {
	p, size := c.paths, c.state.Resources.MaxDiskBytes
	if size < tinyDisk {
		if err := c.recordDisk(ctx, Disk{Kind: DiskTmpfs}); err != nil {
			return err
		}
		if err := sharedMountpoint(p.diskDir); err != nil {
			return err
		}
		opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", size, max(size/(16<<10), 256))
		if err := unix.Mount("tether-disk", p.diskDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount the disk's tmpfs: %w", err)
		}
		return nil
	}
	if err := makeImage(ctx, p.disk, size); err != nil {
		return err
	}
	if err := c.recordDisk(ctx, Disk{Kind: DiskExt4, Image: p.disk}); err != nil {
		return err
	}
	loop, err := attachLoop(p.disk)
	if err != nil {
		return err
	}
	if err := c.recordDisk(ctx, Disk{Kind: DiskExt4, Image: p.disk, Loop: loop.Name()}); err != nil {
		loop.Close()
		return err
	}
	if err := sharedMountpoint(p.diskDir); err != nil {
		loop.Close()
		return err
	}
	err = unix.Mount(loop.Name(), p.diskDir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ext4Options)
	loop.Close() // the mount holds the device now; unmounting releases it (autoclear)
	if err != nil {
		return fmt.Errorf("mount %s on the disk directory: %w", loop.Name(), err)
	}
	return nil
}

// sharedMountpoint bind-mounts path onto itself with shared propagation,
// so that what is mounted on it next (the disk on DIR/disk, the
// project's bind on DIR/root) is unmounted from every mount namespace
// copied from the host's with slave propagation since (the custodian's
// agent jail, bubblewrap) when the host unmounts it. Without it, on a
// host whose mounts are private, such a namespace created while the
// computer runs keeps the file system, and so the loop device, until it
// ends, and teardown reports the device as a leftover (seen in the flake
// hunt, with agent jails of other tests running). A namespace that makes
// its copies private still keeps them until it ends or detaches them, as
// a computer's own namespace does at once. Teardown unmounts both
// (unmountAll).
func sharedMountpoint(path string) error {
	if err := unix.Mount(path, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", path, err)
	}
	if err := unix.Mount("", path, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s's mount point shared: %w", path, err)
	}
	return nil
}

// recordDisk saves the disk in the state before the next step, so a
// failure (or Down from another process) finds what to undo.
func (c *Local) recordDisk(ctx context.Context, d Disk) error {
	c.mu.Lock()
	c.state.Disk = &d
	c.mu.Unlock()
	return c.saveState(ctx)
}

// makeImage creates the image file (root's, 0600), reserves size bytes
// for it on the host and makes an ext4 file system in it with no blocks
// reserved for root.
func makeImage(ctx context.Context, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create the disk image: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("reserve %d bytes for the disk image: %w", size, err)
	}
	mkfs, err := findMkfs()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-O", "^has_journal",
		"-E", "root_owner=0:0,lazy_itable_init=1,nodiscard", path)
	cmd.Env = []string{"PATH=/usr/sbin:/sbin:/usr/bin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 the disk image: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ErrNoMkfs says mkfs.ext4 is missing (e2fsprogs).
var ErrNoMkfs = errors.New("mkfs.ext4 not found (install e2fsprogs)")

func findMkfs() (string, error) {
	for _, p := range []string{"mkfs.ext4", "/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if found, err := exec.LookPath(p); err == nil {
			return found, nil
		}
	}
	return "", ErrNoMkfs
}

// attachLoop attaches image to a free loop device (LOOP_CONFIGURE with
// autoclear: the device is released when its last user, the mount, goes)
// and returns the open device. A device another process takes between
// LOOP_CTL_GET_FREE and the configure is skipped.
func attachLoop(image string) (*os.File, error) {
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("attach the disk image: %w", err)
	}
	defer ctl.Close()
	var last error
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("attach the disk image: LOOP_CTL_GET_FREE: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			last = err
			continue
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}}
		if last = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg); last == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(last, unix.EBUSY) {
			break
		}
	}
	return nil, fmt.Errorf("attach the disk image to a loop device: %w", last)
}

// DiskDetach bounds how long teardown waits for a loop device to be
// released after the root is unmounted.
const DiskDetach = 10 * time.Second

// removeDisk unmounts the project's bind from the tuple root, then the
// disk from DIR/disk (a state written before the disk had its own
// directory has it on the tuple root, which the first unmount takes),
// and waits until the loop device lets the image go; the image itself
// goes with the directory. A mount that stays or a device that stays
// attached is reported (ErrLeftover).
func removeDisk(ctx context.Context, p paths, d *Disk) error {
	if d == nil {
		return nil
	}
	for _, m := range []string{p.root, p.diskDir} {
		if err := unmountAll(m); err != nil {
			return fmt.Errorf("%w: %s stays mounted: %w", ErrLeftover, m, err)
		}
	}
	if d.Loop == "" {
		return nil
	}
	deadline := time.Now().Add(DiskDetach)
	for loopBacks(d.Loop, d.Image) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%w: %s still holds %s after the disk was unmounted", ErrLeftover, d.Loop, d.Image)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// unmountAll unmounts every mount stacked on path (none left is not an
// error).
func unmountAll(path string) error {
	for range 8 {
		err := unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // not a mount point (any more)
		}
		if err != nil {
			return err
		}
	}
	return errors.New("still mounted after 8 unmounts")
}

// loopBacks reports whether the loop device dev is attached to image.
func loopBacks(dev, image string) bool {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		return false
	}
	return strings.TrimSpace(string(b)) == image
}
