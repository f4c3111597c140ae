// Package qmpinput is the visual-only QmpInputAdapter: it talks to one
// QEMU through its QMP unix socket (pinned by path, owner, mode, peer
// credentials and QEMU version) to take screenshots of one pinned display
// and to send bounded pointer and keyboard input in the pixel space of the
// most recent screenshot.
//
// It has no exec, no files, no clipboard and no browser: those operations
// fail with ErrUnsupported and never fall through to another backend. It
// shares no code path with tether's file and exec chain.
//
// The set of QMP commands it can send is closed (qmp_capabilities,
// screendump, input-send-event); anything else is refused before a byte
// is written. See docs/qmpinput.md for the contracts.
package qmpinput
