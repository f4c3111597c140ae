package host

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// sealedCopy copies the binary at path into a sealed memfd while hashing
// it, and refuses it unless its SHA-256 equals want. The caller executes
// the memfd (/proc/self/fd/N), so the bytes that run are exactly the bytes
// that were hashed: replacing or rewriting the file at path after the check
// changes nothing. The caller closes the returned file once the plugin has
// started.
func sealedCopy(path string, want []byte) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open plugin: %w", err)
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open plugin: %s is not a regular file", path)
	}
	mem, err := newMemfd()
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(mem, h), io.LimitReader(src, MaxPluginBytes+1))
	switch {
	case err != nil:
		mem.Close()
		return nil, fmt.Errorf("copy plugin: %w", err)
	case n > MaxPluginBytes:
		mem.Close()
		return nil, fmt.Errorf("plugin %s is larger than %d bytes", path, MaxPluginBytes)
	}
	if got := h.Sum(nil); subtle.ConstantTimeCompare(got, want) != 1 {
		mem.Close()
		return nil, &ChecksumError{Path: path, Want: hex.EncodeToString(want), Got: hex.EncodeToString(got)}
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		mem.Close()
		return nil, fmt.Errorf("seal plugin copy: %w", err)
	}
	return mem, nil
}

// newMemfd creates an executable, sealable memfd; kernels before 6.3 do not
// know MFD_EXEC (executable is then the default).
func newMemfd() (*os.File, error) {
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate("tether-plugin", flags|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("tether-plugin", flags)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	return os.NewFile(uintptr(fd), "tether-plugin"), nil
}

// execPath is how the child names the sealed copy.
func execPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }
