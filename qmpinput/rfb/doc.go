// Package rfb is the gating half of the live view: it parses every
// client-to-server RFB message a browser viewer sends (RFC 6143 section
// 7.5, plus QEMU's extended key event) and proxies one viewer to its own
// shared connection to QEMU's VNC server.
//
// The client message set is small and closed. A Session forwards only
// re-encoded messages, never the viewer's raw bytes: key and pointer
// events only through a Gate (the arbiter says whether this viewer holds
// control), SetEncodings filtered to an allowlist (no clipboard, power,
// audio or resize extensions), ClientCutText never. An unknown, truncated
// or out-of-bounds message is fatal to that viewer's session alone.
//
// The server-to-client stream (framebuffer updates) passes through
// unchanged; QEMU only sends what the filtered encodings enable.
package rfb
