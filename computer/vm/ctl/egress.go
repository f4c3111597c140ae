package ctl

import (
	"bytes"
	"fmt"
)

// The VM tier's egress over the control port: OpEgress makes the guest's
// agent listen on 127.0.0.1:Port in the guest and dial a wire stream to
// the host for every connection there (computer/vm/muxlink's guest
// dials; the host's egress proxy serves them). OpRefusal appends one of
// the proxy's refusal lines to RefusalLog in the guest, where the
// commands read it.

// RefusalLog is where a VM computer's commands read the egress proxy's
// refusals: one line each, root's file, mode 0644, in a directory of
// its own (root's, 0755) that the commands' Landlock rules let them
// read. When a line would take it past MaxRefusalLogBytes it is renamed
// to RefusalLog + ".1" (the one before is dropped), as on a namespaced
// computer.
const (
	RefusalDir         = "/run/tether-egress"
	RefusalLog         = RefusalDir + "/egress-refused.log"
	MaxRefusalLogBytes = 256 << 10
	// MaxRefusalLine bounds one refusal line (provision.RefusalLine
	// quotes three fields of at most 512 bytes each: at most 4 bytes a
	// byte once quoted).
	MaxRefusalLine = 8 << 10
)

// checkEgress refuses a port out of range for OpEgress, a port with any
// other op, and refusal data that is not one line of at most
// MaxRefusalLine bytes ending in a newline.
func checkEgress(r Request) error {
	switch {
	case r.Op == OpEgress && (r.Port < 1 || r.Port > 65535):
		return fmt.Errorf("%w: egress port %d not in 1..65535", ErrProtocol, r.Port)
	case r.Op != OpEgress && r.Port != 0:
		return fmt.Errorf("%w: port goes with op %q only", ErrProtocol, OpEgress)
	case r.Op != OpRefusal:
		return nil
	case len(r.Data) == 0 || len(r.Data) > MaxRefusalLine:
		return fmt.Errorf("%w: refusal line of %d bytes not in 1..%d", ErrProtocol, len(r.Data), MaxRefusalLine)
	case bytes.IndexByte(r.Data, '\n') != len(r.Data)-1:
		return fmt.Errorf("%w: refusal data is not one line ending in a newline", ErrProtocol)
	case bytes.IndexByte(r.Data, 0) >= 0:
		return fmt.Errorf("%w: refusal line holds a NUL", ErrProtocol)
	}
	return nil
}
