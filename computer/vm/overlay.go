package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
)

// makeOverlay makes the computer's copy-on-write disk over the saved
// state's template disk: a qcow2 of the same size whose every unwritten
// cluster reads from the template disk. qemu-img runs with -u, so it
// never opens the backing file; the header's backing name is only a
// note, since QEMU is given the backing itself (overlayArgs).
func (m *Machine) makeOverlay(ctx context.Context) error {
	p := m.diskPath()
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-u",
		"-b", m.saved.disk, "-F", "raw", p, strconv.FormatInt(m.saved.diskBytes, 10)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create %s: %w: %s", p, err, out)
	}
	return os.Chown(p, int(m.qemuUID), int(m.qemuUID))
}

// overlayNode is the writable layer over a saved state as a block node:
// the qcow2, and its backing named here, not read from the qcow2's
// header (a header QEMU's uid rewrote cannot point QEMU at another
// file); QEMU opens a backing node read-only.
func (m *Machine) overlayNode() map[string]any {
	return map[string]any{
		"driver":    "qcow2",
		"node-name": "tether-disk",
		"file":      map[string]any{"driver": "file", "filename": m.diskPath()},
		"backing": map[string]any{"driver": "raw", "read-only": true,
			"file": map[string]any{"driver": "file", "filename": m.saved.disk}},
	}
}

// overlayArgs is the -blockdev of overlayNode.
func (m *Machine) overlayArgs() []string {
	b, err := json.Marshal(m.overlayNode())
	if err != nil {
		panic(err) // maps of strings and bools always marshal
	}
	return []string{"-blockdev", string(b)}
}
