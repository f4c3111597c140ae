// Package bins names tether's binaries and checks a directory that holds
// them: the provisioner (computer/provision) runs tether-receiver from
// one. Building them for tests is fixtures/bins' job.
package bins

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// The binaries of the chain, by name.
const (
	Admission = "tether-admission"
	Receiver  = "tether-receiver"
	Custodian = "tether-custodian"
	Plugin    = "tether-plugin"
	HostAgent = "tether-hostagent"
	Demo      = "tether-demo"
	Computer  = "tether-computer"
	VMGuest   = "tether-vmguest" // PID 1 of a VM computer's guest (static)
)

// ErrMissing is returned when a required binary is not in a directory.
var ErrMissing = errors.New("binary missing")

// Set is a directory holding the chain's binaries.
type Set struct {
	Dir string
}

// Path returns the absolute path of the named binary in s.
func (s Set) Path(name string) string { return filepath.Join(s.Dir, name) }

// Require checks that every named binary is a regular executable file in
// s.Dir and names the first one that is not.
func (s Set) Require(names ...string) error {
	for _, n := range names {
		fi, err := os.Stat(s.Path(n))
		switch {
		case err != nil:
			return fmt.Errorf("%w: %s: %w", ErrMissing, n, err)
		case !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0:
			return fmt.Errorf("%w: %s is not an executable regular file", ErrMissing, s.Path(n))
		}
	}
	return nil
}

// SHA256 returns the hex SHA-256 of the named binary.
func (s Set) SHA256(name string) (string, error) {
	f, err := os.Open(s.Path(name))
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
