package vmguest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/computer/vm/ctl"
)

// The random driver's ioctls (linux/random.h); x/sys/unix lacks them.
const (
	rndAddEntropy  = 0x40085203 // _IOW('R', 0x03, int[2])
	rndReseedCRNG  = 0x5207     // _IO('R', 0x07)
	machineIDPath  = "/etc/machine-id"
	admissionMode  = 0o644
	identityParent = 0o755
)

// errNoIdentity refuses an op that needs the computer's identity before
// the host sent it.
var errNoIdentity = errors.New("the guest has no identity yet")

// identified reports whether the ops that act on the grant's uid and
// root may run: always for a guest configured with them at boot.
func (a *agent) identified() bool { return !a.cfg.AwaitIdentity || a.cfg.UID != 0 }

// takeIdentity makes this guest one computer, once: the kernel's random
// pool is reseeded with the host's entropy before anything else (a
// restored guest's pool is its siblings'), then the machine id and the
// files are written, the grant's cgroup and root made, and the receiver
// and the wire bridge started.
func (a *agent) takeIdentity(id *ctl.Identity) error {
	if !a.cfg.AwaitIdentity || a.cfg.UID != 0 {
		return errors.New("identity: this guest already has one")
	}
	if err := reseed(id.Entropy); err != nil {
		return err
	}
	files := append([]ctl.IdentityFile{{Path: machineIDPath, Data: []byte(id.MachineID + "\n"), Mode: 0o444}}, id.Files...)
	for _, f := range files {
		if err := writeReplacing(f.Path, f.Data, os.FileMode(f.Mode)); err != nil {
			return fmt.Errorf("identity: %w", err)
		}
	}
	cfg := a.cfg
	cfg.UID, cfg.GID, cfg.PidsMax, cfg.MemoryMax, cfg.RootBytes = id.UID, id.GID, id.PidsMax, id.MemoryMax, id.RootBytes
	if err := makeCgroupParent(cfg); err != nil {
		return err
	}
	if err := makeRoot(cfg); err != nil {
		return err
	}
	if err := makeRefusalDir(ctl.RefusalDir); err != nil { // before the receiver opens its Landlock paths
		return err
	}
	a.cfg = cfg
	return a.begin()
}

// reseed credits entropy to the kernel's input pool (RNDADDENTROPY) and
// forces the CRNG to reseed from it at once (RNDRESEEDCRNG), which also
// moves the generation every per-CPU and vDSO state checks.
func reseed(entropy []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reseed: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 8+len(entropy)+3)
	binary.NativeEndian.PutUint32(buf[0:], uint32(8*len(entropy)))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(entropy)))
	copy(buf[8:], entropy)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("reseed: RNDADDENTROPY: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndReseedCRNG, 0); e != 0 {
		return fmt.Errorf("reseed: RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// writeAdmission replaces the admission file the receiver reads.
func (a *agent) writeAdmission(data []byte) error {
	if !a.cfg.AwaitIdentity {
		return errors.New("admission: this guest reads its admission file from a share")
	}
	return writeReplacing(a.cfg.AdmissionFile, data, admissionMode)
}

// writeReplacing writes data to a temporary file beside path, root's with
// mode perm, and renames it over path, so a reader sees the old file or
// the new one, never a part.
func writeReplacing(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, identityParent); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(data)
	err = errors.Join(werr, tmp.Chmod(perm), tmp.Sync(), tmp.Close())
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
