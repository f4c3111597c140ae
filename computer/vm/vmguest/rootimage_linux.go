package vmguest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Where the image's layers are mounted before the switch: in the
// initramfs, which the new root then hides (the mounts stay, reachable by
// no path).
const (
	imageBase  = "/.image/base"
	imageUpper = "/.image/rw"
	imageRoot  = "/.image/root"
)

// movedMounts are the MountBasics mounts carried into the new root
// (their submounts, /dev/pts, /dev/shm and /sys/fs/cgroup, move along).
var movedMounts = []string{"/dev", "/proc", "/sys", "/tmp", "/run"}

// switchRoot mounts the overlay of r's disks, binds r.Binds into it,
// moves the basic mounts over and makes it the root of PID 1 (as
// switch_root does: the initramfs cannot be pivoted away).
func switchRoot(r *RootImage) error {
	base, err := diskBySerial(r.BaseSerial, portWait)
	if err != nil {
		return err
	}
	upper, err := diskBySerial(r.UpperSerial, portWait)
	if err != nil {
		return err
	}
	for _, d := range []string{imageBase, imageUpper, imageRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(base, imageBase, "ext4", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "noload"); err != nil {
		return fmt.Errorf("mount the base image %s: %w", base, err)
	}
	if err := unix.Mount(upper, imageUpper, "ext4", unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("mount the writable layer %s: %w", upper, err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(imageUpper, d), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", imageBase, imageUpper, imageUpper)
	if err := unix.Mount("overlay", imageRoot, "overlay", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("mount the root overlay: %w", err)
	}
	for _, b := range r.Binds {
		if err := bindReadOnly(b, imageRoot+b); err != nil {
			return err
		}
	}
	for _, d := range r.Tmpfs {
		if err := os.MkdirAll(imageRoot+d, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", imageRoot+d, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, "mode=0755"); err != nil {
			return fmt.Errorf("mount a tmpfs on %s: %w", d, err)
		}
	}
	for _, m := range movedMounts {
		if err := os.MkdirAll(imageRoot+m, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m, imageRoot+m, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into the new root: %w", m, err)
		}
	}
	if err := os.Chdir(imageRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot into the new root: %w", err)
	}
	return os.Chdir("/")
}

// bindReadOnly binds src (a file or a directory of the initramfs) on dst,
// creating dst's mount point, and remounts the bind read-only.
func bindReadOnly(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if st.IsDir() {
		err = os.MkdirAll(dst, 0o755)
	} else if f, ferr := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o600); ferr == nil {
		err = f.Close()
	} else {
		err = ferr
	}
	if err != nil {
		return fmt.Errorf("bind %s: mount point: %w", src, err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("bind %s read-only: %w", src, err)
	}
	return nil
}

// diskBySerial finds the virtio-blk disk whose serial is serial, waiting
// up to wait for its driver to probe it.
func diskBySerial(serial string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		names, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err == nil && strings.TrimSpace(string(b)) == serial {
				dev := "/dev/" + filepath.Base(filepath.Dir(n))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio disk with serial %q among %d", serial, len(names))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
