package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/vm/ctl"
)

// identityEntropy is how many bytes of host randomness each guest's
// kernel pool gets before its receiver starts.
const identityEntropy = 64

// inject makes the guest this computer: fresh entropy for its kernel's
// pool, a fresh machine id, the receiver's key and certificate (minted
// for this computer alone by makePKI), the admission key and a first
// snapshot holding no grant. The guest starts its receiver only then,
// so a guest restored from a state other computers share never serves
// before it has its own identity.
func (m *Machine) inject(ctx context.Context) error {
	if _, err := m.grants.Publish(ctx, time.Time{}); err != nil {
		return err
	}
	snap, err := os.ReadFile(filepath.Join(m.paths.admission, admission.FileName))
	if err != nil {
		return err
	}
	files, err := m.identityFiles()
	if err != nil {
		return err
	}
	id := &ctl.Identity{Entropy: make([]byte, identityEntropy), UID: m.alloc.UID, GID: m.alloc.GID,
		PidsMax: m.limits.Pids, MemoryMax: m.limits.MemoryBytes, RootBytes: m.tmpfsRootBytes()}
	var mid [16]byte
	if _, err := rand.Read(id.Entropy); err != nil {
		return err
	}
	if _, err := rand.Read(mid[:]); err != nil {
		return err
	}
	id.MachineID = hex.EncodeToString(mid[:])
	for _, f := range files {
		id.Files = append(id.Files, ctl.IdentityFile{Path: f.Path, Data: f.Data, Mode: uint32(f.Mode.Perm())})
	}
	id.Files = append(id.Files, ctl.IdentityFile{Path: GuestAdmission + "/" + admission.FileName, Data: snap, Mode: 0o644})
	if _, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpIdentity, Identity: id}); err != nil {
		return fmt.Errorf("inject the guest's identity: %w", err)
	}
	m.machineID = id.MachineID
	return nil
}

// publish signs a snapshot holding grants into DIR/admission and pushes
// it to the guest's admission file over the control port. A stopped
// guest is let run for the push (with its clock set) and stopped again
// after, as KillCommands does: the snapshot takes effect when the push
// lands, before publish returns.
func (m *Machine) publish(ctx context.Context, grants ...admission.Grant) error {
	if _, err := m.grants.Publish(ctx, time.Time{}, grants...); err != nil {
		return err
	}
	if m.isFrozen() {
		if err := m.Thaw(ctx); err != nil {
			return err
		}
		return errors.Join(m.pushAdmission(ctx), m.Freeze(ctx))
	}
	return m.pushAdmission(ctx)
}

// pushAdmission sends DIR/admission's snapshot to the guest.
func (m *Machine) pushAdmission(ctx context.Context) error {
	snap, err := os.ReadFile(filepath.Join(m.paths.admission, admission.FileName))
	if err != nil {
		return err
	}
	if _, err := m.ctlCall(ctx, ctl.Request{Op: ctl.OpAdmission, Data: snap}); err != nil {
		return fmt.Errorf("push the admission snapshot: %w", err)
	}
	return nil
}
