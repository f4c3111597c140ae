// Package view is the live view: a web page where a person watches one
// VM's screen, takes over its input, hands it back, and pauses or
// resumes the VM, served by tether-qmp view.
//
// The screen is QEMU's own VNC server on a pinned unix socket, proxied
// to the browser as RFB over WebSocket (the noVNC client, embedded) by
// the gating proxy of package rfb. Who may send input is decided by one
// arbiter around qmpinput.Handover: the agent by default, or the one
// person who took over with a control token. Nothing a viewer sends
// reaches the guest unless the arbiter allows it.
//
// Access is by one-time links (package token) exchanged for a Secure,
// HttpOnly, SameSite=Strict cookie; every API and WebSocket request
// checks the cookie's token (live, not revoked), its role and the
// Origin. Every begin, end, pause and resume goes to the hash-chained
// audit log (package auditlog), never content.
//
// The view shares no code with tether's file and exec chain.
package view
