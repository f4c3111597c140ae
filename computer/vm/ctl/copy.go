package ctl

import (
	"fmt"
	"strings"
)

// Copy in and out of a VM computer's root go through its guest, over
// this port, in lockstep: the host sends one request and waits for its
// answer, so the guest never holds more than one chunk the host sent and
// the host never more than one chunk the guest sent (the port has no
// flow control of its own). One copy at a time: a begin ends any copy
// still in progress (as copy_abort does).
//
// Copy in: copy_in_begin names the directory beneath the grant root the
// tar is extracted into; each copy_in_data carries the next 1 to
// MaxCopyChunk bytes of the tar and is answered once the guest's
// extraction (computer/archive.ExtractTar, files the grant's) took them;
// copy_in_end answers when the extraction is done, with the files it
// made. Copy out: copy_out_begin names the path beneath the grant root;
// each copy_out_data answers the next 1 to MaxCopyChunk bytes of its tar
// (computer/archive.WriteTar), or Done with the files it wrote.
//
// A copy the guest's archive checks refuse answers Error with Refused,
// one of the Refused* names. Files is the guest's claim; the host
// computes the receipt's SHA-256 and length over the bytes it sent or
// took itself (computer/vm copy.go).

// MaxCopyChunk bounds one copy_in_data or copy_out_data chunk.
const MaxCopyChunk = 1 << 20

// MaxCopyPath bounds a copy's path.
const MaxCopyPath = 4096

// The archive checks a guest names in Response.Refused.
const (
	RefusedUnsafe   = "unsafe_entry" // computer/archive.ErrUnsafeEntry
	RefusedTooLarge = "too_large"    // computer/archive.ErrTooLarge
	RefusedNotNew   = "not_new"      // computer/archive.ErrNotEmpty
)

// checkCopy refuses a copy_in_data without a chunk of 1..MaxCopyChunk
// bytes, a chunk with any other copy op, a copy_out_begin without a
// path, and a path with a NUL or over MaxCopyPath bytes.
func checkCopy(r Request) error {
	if !strings.HasPrefix(string(r.Op), "copy_") {
		return nil
	}
	switch {
	case r.Op == OpCopyInData && (len(r.Data) == 0 || len(r.Data) > MaxCopyChunk):
		return fmt.Errorf("%w: copy chunk of %d bytes not in 1..%d", ErrProtocol, len(r.Data), MaxCopyChunk)
	case r.Op != OpCopyInData && len(r.Data) != 0:
		return fmt.Errorf("%w: data goes with op %q only among the copy ops", ErrProtocol, OpCopyInData)
	case r.Op == OpCopyOutBegin && r.Path == "":
		return fmt.Errorf("%w: %s needs a path", ErrProtocol, r.Op)
	case r.Op != OpCopyInBegin && r.Op != OpCopyOutBegin && r.Path != "":
		return fmt.Errorf("%w: a path goes with the begin ops only among the copy ops", ErrProtocol)
	case len(r.Path) > MaxCopyPath || strings.IndexByte(r.Path, 0) >= 0:
		return fmt.Errorf("%w: copy path of %d bytes (max %d) or with a NUL", ErrProtocol, len(r.Path), MaxCopyPath)
	}
	return nil
}

// CopyChunk checks a guest's answer to copy_out_data and returns its
// chunk, or done and the guest's file count: exactly one of 1 to
// MaxCopyChunk bytes of Data, or Done with no Data; Files (never
// negative) only with Done. Anything else is ErrProtocol: the guest is
// not trusted to follow the protocol.
func CopyChunk(r Response) (chunk []byte, done bool, files int64, err error) {
	switch {
	case r.Error != "":
		return nil, false, 0, fmt.Errorf("%w: copy_out_data: an error answer is not a chunk", ErrProtocol)
	case r.Done && len(r.Data) > 0:
		return nil, false, 0, fmt.Errorf("%w: copy_out_data: done with %d bytes of data", ErrProtocol, len(r.Data))
	case r.Done && r.Files < 0:
		return nil, false, 0, fmt.Errorf("%w: copy_out_data: %d files", ErrProtocol, r.Files)
	case r.Done:
		return nil, true, r.Files, nil
	case len(r.Data) == 0 || len(r.Data) > MaxCopyChunk:
		return nil, false, 0, fmt.Errorf("%w: copy_out_data: chunk of %d bytes not in 1..%d", ErrProtocol, len(r.Data), MaxCopyChunk)
	case r.Files != 0:
		return nil, false, 0, fmt.Errorf("%w: copy_out_data: files before the end", ErrProtocol)
	}
	return r.Data, false, 0, nil
}
