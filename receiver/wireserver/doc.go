// Package wireserver serves the receiver/wire protocol: the accept loop,
// the per-connection read loop, the caps per peer and in total, and the
// Handler the receiver implements. Only the receiver links it; the
// custodian links receiver/wire (the contract and the client), never this
// package (ci/deps checks it).
package wireserver
