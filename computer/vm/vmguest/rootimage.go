package vmguest

import "fmt"

// RootImage makes the guest's root an overlay of two virtio-blk disks
// instead of the initramfs: a read-only ext4 base (the Debian userland
// ci/guestimage builds) and a writable ext4 layer (the computer's disk),
// found by their virtio serial numbers. Binds are initramfs paths
// (tether's binaries and the agent's configuration) bound read-only at
// the same paths in the new root, so the base image holds no tether
// file and no computer's secret. Tmpfs are directories of the new root
// mounted as tmpfs (root's, 0755), so what is written there (the
// identity: the receiver's key) never reaches the writable disk, which
// an export carries.
type RootImage struct {
	BaseSerial  string   `json:"base_serial"`
	UpperSerial string   `json:"upper_serial"`
	Binds       []string `json:"binds"`
	Tmpfs       []string `json:"tmpfs,omitempty"`
}

// validate reports the first invalid field.
func (r *RootImage) validate() error {
	if r.BaseSerial == "" || r.UpperSerial == "" || r.BaseSerial == r.UpperSerial {
		return fmt.Errorf("%w: root_image needs two distinct disk serials", ErrConfig)
	}
	for i, b := range r.Binds {
		if !absClean(b) || b == "/" {
			return fmt.Errorf("%w: root_image.binds[%d] %q is not an absolute clean path below /", ErrConfig, i, b)
		}
	}
	for i, d := range r.Tmpfs {
		if !absClean(d) || d == "/" {
			return fmt.Errorf("%w: root_image.tmpfs[%d] %q is not an absolute clean path below /", ErrConfig, i, d)
		}
	}
	return nil
}
