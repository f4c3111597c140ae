package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/vm/guest"
	"github.com/tetherdev/tether/computer/vm/image"
)

// A saved state is one slot per guest RAM size in Config.StateDir, and,
// when the guest boots the guest image, per disk size too:
//
//	STATEDIR/m<MiB>/           0755 root  initramfs alone
//	STATEDIR/m<MiB>-d<bytes>/  0755 root  guest image over a writable disk of that size
//	  initramfs.cpio      0644 root  the generic image the state was booted from
//	  state.mig           0644 root  QEMU's migration stream of the stopped guest
//	  disk.raw            0444 root  the template's writable disk as it was when saved (image only)
//	  key                 0644 root  the digest the slot was made for
//
// The key is the SHA-256 of the kernel, the initramfs, QEMU's version,
// the RAM size, the accelerator and stateFormat, and with the image its
// digest and the disk size; a slot whose key differs is stale and is
// made again. No file holds anything of a computer: the guest waits for
// its identity (inject) when it is saved.
//
// The saved guest has its root mounted from the template's disk, and
// its RAM holds that file system's state: a computer restored from the
// slot must see exactly that disk, of exactly that size. So each
// computer gets a copy-on-write disk (qcow2) over disk.raw, which every
// QEMU opens read-only, and the disk size is part of the slot: a
// computer whose disk limit differs from every slot made so far gets a
// slot of its own (one template boot more), never a disk it could
// outgrow.
type savedState struct {
	dir, initramfs, state string
	// disk is the slot's template disk (disk.raw), "" without the image;
	// diskBytes is its size.
	disk      string
	diskBytes int64
}

// stateFormat changes whenever the guest's devices or the saving change.
const stateFormat = "tether-vm-state/2"

// plainPath is what may appear in QEMU's exec: migration URI, which a
// shell reads.
var plainPath = regexp.MustCompile(`^[A-Za-z0-9/._+-]+$`)

// incoming is QEMU's arguments to start from the state.
func (s *savedState) incoming() []string {
	return []string{"-incoming", "exec:cat " + s.state}
}

// savedState returns the slot for limits' RAM size (and, with img, its
// disk size), making it first if it is missing or stale (checked once
// per Provisioner, and again when its state file is gone). Concurrent
// callers wait for one another.
func (p *Provisioner) savedState(ctx context.Context, limits api.Limits, img *image.Image) (*savedState, error) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	mib := limits.MemoryBytes >> 20
	name := fmt.Sprintf("m%d", mib)
	if img != nil {
		name = fmt.Sprintf("m%d-d%d", mib, limits.DiskBytes)
	}
	s := &savedState{dir: filepath.Join(p.cfg.StateDir, name)}
	s.initramfs, s.state = filepath.Join(s.dir, "initramfs.cpio"), filepath.Join(s.dir, "state.mig")
	if img != nil {
		s.disk, s.diskBytes = filepath.Join(s.dir, "disk.raw"), limits.DiskBytes
	}
	if !plainPath.MatchString(s.state) {
		return nil, fmt.Errorf("%w: state dir %q has characters a shell would read", ErrConfig, p.cfg.StateDir)
	}
	if _, err := os.Stat(s.state); err == nil && p.fresh[s.dir] {
		return s, nil
	}
	if err := checkStateDir(p.cfg.StateDir); err != nil {
		return nil, err
	}
	tmp := filepath.Join(p.cfg.StateDir, ".image-"+name+".cpio")
	defer os.Remove(tmp)
	k, err := p.kernel()
	if err != nil {
		return nil, err
	}
	if err := buildGenericImage(ctx, p.cfg.Bins, k, tmp, rootImageFor(img), false, 0); err != nil {
		return nil, err
	}
	keyed := []any{k.Vmlinux, tmp, mib}
	if img != nil {
		keyed = append(keyed, keyNote(img.Digest()), s.diskBytes)
	}
	key, err := p.stateKey(ctx, k, keyed...)
	if err != nil {
		return nil, err
	}
	if old, err := os.ReadFile(filepath.Join(s.dir, "key")); err != nil || string(old) != key {
		p.logf("vm: saving a guest state in %s (key %.12s)", name, key)
		if err := p.saveState(ctx, s, k, tmp, key, limits, img); err != nil {
			return nil, err
		}
	}
	if p.fresh == nil {
		p.fresh = map[string]bool{}
	}
	p.fresh[s.dir] = true
	return s, nil
}

// checkStateDir makes dir (0755) if it is missing and refuses one that
// someone but root could change: every computer's guest starts from
// what is in it.
func checkStateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: state dir %s must be a directory root owns that no one else may write (%v)", ErrConfig, dir, fi.Mode())
	}
	return nil
}

// keyNote is a string stateKey hashes as it is, not as a path.
type keyNote string

// stateKey is the digest a slot is made for: each of files is a path
// (string) whose content is hashed, or a value whose %v is.
func (p *Provisioner) stateKey(ctx context.Context, k guest.Kernel, files ...any) (string, error) {
	h := sha256.New()
	bin := p.cfg.QEMU
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	ver, err := exec.CommandContext(ctx, bin, "-version").Output()
	if err != nil {
		return "", fmt.Errorf("qemu -version: %w", err)
	}
	accel, err := p.chooseAccel(ctx, k)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "%s\n%s\n%s\n", stateFormat, ver, accel.Name)
	for _, f := range files {
		if path, ok := f.(string); ok {
			if err := hashFile(h, path); err != nil {
				return "", err
			}
			continue
		}
		fmt.Fprintf(h, "%v\n", f)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// saveState remakes the slot: it boots a template guest from initramfs
// (and img over a fresh writable disk, if set), confined as any
// computer's QEMU, stops it once its agent answers, migrates it to a
// file and quits it; its disk becomes the slot's, read-only.
func (p *Provisioner) saveState(ctx context.Context, s *savedState, k guest.Kernel, initramfs, key string, limits api.Limits, img *image.Image) error {
	if err := os.RemoveAll(s.dir); err != nil {
		return err
	}
	if err := os.Mkdir(s.dir, 0o755); err != nil {
		return err
	}
	if err := errors.Join(os.Rename(initramfs, s.initramfs), os.Chmod(s.initramfs, 0o644)); err != nil {
		return err
	}
	t := &Machine{p: p, paths: layout(filepath.Join(p.cfg.StateDir, ".template")), limits: limits, template: true,
		initramfs: s.initramfs, rootImg: img}
	t.kernel = k
	_ = p.Destroy(ctx, t.paths.dir) // a template a crash left
	err := provision.RunSteps(ctx, "vm template", []provision.Step{
		{Name: "validate.Limits", Run: t.validate},
		{Name: "allocate.IDs", Run: t.allocate},
		{Name: "layout.Directories", Run: t.makeLayout},
		{Name: "guest.Disk", Run: t.makeDisk},
		{Name: "qemu.Cgroups", Run: t.makeCgroups},
		{Name: "qemu.Boot", Run: t.boot},
		{Name: "qemu.Save", Run: t.saveTo},
	}, t.teardown, 30*time.Second)
	if err != nil {
		os.RemoveAll(s.dir)
		return err
	}
	mig := filepath.Join(t.paths.qemu, "state.mig")
	err = errors.Join(os.Rename(mig, s.state), os.Chown(s.state, 0, 0), os.Chmod(s.state, 0o644), keepDisk(t, s),
		writeOwned(filepath.Join(s.dir, "key"), []byte(key), 0o644, 0, 0), t.Close(ctx))
	if err != nil {
		os.RemoveAll(s.dir)
	}
	return err
}

// keepDisk moves the template's writable disk, as QEMU left it when the
// migration completed, into the slot: root's, read-only to everyone.
func keepDisk(t *Machine, s *savedState) error {
	if s.disk == "" {
		return nil
	}
	return errors.Join(os.Rename(t.diskPath(), s.disk), os.Chown(s.disk, 0, 0), os.Chmod(s.disk, 0o444))
}

// saveTo stops the template guest, migrates it to qemu/state.mig and
// quits QEMU.
func (m *Machine) saveTo(ctx context.Context) error {
	m.ctl.Close()
	m.ctl = nil
	q := func(cmd string, args any) (json.RawMessage, error) {
		return qmpExecuteArgs(ctx, m.paths.qmp, m.qemuUID, cmd, args)
	}
	if _, err := q("stop", nil); err != nil {
		return err
	}
	mig := filepath.Join(m.paths.qemu, "state.mig")
	if _, err := q("migrate", map[string]string{"uri": "exec:cat > " + mig}); err != nil {
		return err
	}
	for {
		ret, err := q("query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(ret, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			_, err := q("quit", nil)
			<-m.vm.Done()
			return err
		case "failed", "cancelled":
			return fmt.Errorf("%w: migration to a file: %s %s", ErrGuest, st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// resume waits for QEMU to load the saved state and lets the guest run
// (the state was saved stopped, so QEMU leaves it paused).
func (m *Machine) resume(ctx context.Context) error {
	for {
		ret, err := qmpExecute(ctx, m.paths.qmp, m.qemuUID, "query-status")
		if err == nil {
			var st qmpStatus
			if err := json.Unmarshal(ret, &st); err != nil {
				return err
			}
			switch {
			case st.Running:
				return nil
			case st.Status != "inmigrate":
				_, err := qmpExecute(ctx, m.paths.qmp, m.qemuUID, "cont")
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restore the saved state: %w (last: %v)", ctx.Err(), err)
		case <-m.vm.Done():
			_, werr := m.vm.Wait(ctx) // carries QEMU's stderr
			return fmt.Errorf("%w: QEMU exited while it restored the saved state: %w", ErrGuest, werr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
