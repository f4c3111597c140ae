// Package wire is the receiver's framed protocol: a 4-byte big-endian length
// and one strict JSON object per frame, requests multiplexed by id on one
// byte stream. The custodian imports it as the client side; the receiver
// serves it. docs/protocol.md is its reference. The error codes its
// responses carry are the closed set of admission/errcode.
package wire
