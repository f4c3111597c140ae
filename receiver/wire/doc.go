// Package wire is the receiver's framed protocol: a 4-byte big-endian length
// and one strict JSON object per frame, requests multiplexed by id on one
// byte stream. It holds the contract (messages, ops, frames, strict
// decoding, limits and the peer naming they count by, the error codes of
// admission/errcode) and the client the custodian calls with; it links no
// server. The receiver serves it with receiver/wireserver. docs/protocol.md
// is its reference.
package wire
