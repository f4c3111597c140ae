package ctl

import (
	"encoding/hex"
	"fmt"
	"path"
)

// Identity is what makes one guest a computer of its own: the host sends
// it once, after the guest booted or was restored from a saved state
// that many computers share. The guest first mixes Entropy into its
// kernel's random pool and forces a reseed (a restored guest's pool is
// every sibling's), then writes MachineID and Files, makes the grant's
// root and cgroup, and only then starts the receiver, whose TLS key is
// among Files.
type Identity struct {
	// Entropy is fresh host randomness, MinEntropy..MaxEntropy bytes.
	Entropy []byte `json:"entropy"`
	// MachineID is /etc/machine-id: 32 lowercase hex digits.
	MachineID string `json:"machine_id"`
	// UID and GID are the grant's (owners of the root).
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// PidsMax, MemoryMax and RootBytes bound the grant's commands (see
	// vmguest.Config).
	PidsMax   int64 `json:"pids_max,omitempty"`
	MemoryMax int64 `json:"memory_max,omitempty"`
	RootBytes int64 `json:"root_bytes,omitempty"`
	// Files are written (parents made 0755) before the receiver starts:
	// its configuration, certificate, key and issuer, the admission key
	// and the first admission snapshot.
	Files []IdentityFile `json:"files"`
}

// IdentityFile is one file an Identity places in the guest.
type IdentityFile struct {
	Path string `json:"path"` // absolute and clean
	Data []byte `json:"data"`
	Mode uint32 `json:"mode"` // permission bits only
}

// Bounds of an Identity's entropy.
const (
	MinEntropy = 32
	MaxEntropy = 512
)

// checkPayload validates the members only some ops carry.
func checkPayload(r Request) error {
	if (r.Identity != nil) != (r.Op == OpIdentity) {
		return fmt.Errorf("%w: identity goes with op %q only", ErrProtocol, OpIdentity)
	}
	if r.Identity != nil {
		return r.Identity.Validate()
	}
	if err := checkCopy(r); err != nil {
		return err
	}
	return checkEgress(r)
}

// Validate reports the first invalid member.
func (id *Identity) Validate() error {
	if n := len(id.Entropy); n < MinEntropy || n > MaxEntropy {
		return fmt.Errorf("%w: identity: entropy of %d bytes not in %d..%d", ErrProtocol, n, MinEntropy, MaxEntropy)
	}
	if b, err := hex.DecodeString(id.MachineID); err != nil || len(b) != 16 || hex.EncodeToString(b) != id.MachineID {
		return fmt.Errorf("%w: identity: machine_id is not 32 lowercase hex digits", ErrProtocol)
	}
	if id.UID == 0 || id.GID == 0 {
		return fmt.Errorf("%w: identity: the grant's uid and gid must not be 0", ErrProtocol)
	}
	for i, f := range id.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" || f.Mode&^0o777 != 0 {
			return fmt.Errorf("%w: identity: files[%d]: %q mode %o", ErrProtocol, i, f.Path, f.Mode)
		}
	}
	return nil
}
