package audit

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Report is what Verify established.
type Report struct {
	Records      int64  // complete records in the log
	Signed       int64  // records covered by the log's checkpoint
	Unsigned     int64  // records appended after that checkpoint
	TornBytes    int64  // bytes of an interrupted last append
	TreeHash     string // base64 tree hash of the signed prefix
	ExternalSize int64  // size of the external checkpoint checked (-1 if none)
}

// Verify checks the audit log in dir without modifying it:
//   - the log's checkpoint is signed by v and names v's log;
//   - every record decodes, its seq is its position, and each of the
//     first Size records is proven included in the signed tree
//     (tlog.ProveRecord / CheckRecord);
//   - when external is not nil (an older checkpoint kept elsewhere), it is
//     signed by v, the log has at least its size, and the signed tree is
//     proven consistent with it (tlog.ProveTree / CheckTree).
//
// Truncation (fewer records than a checkpoint covers) fails with
// ErrTruncated; an edited or reordered record with ErrTampered; a log that
// rewrote history an older checkpoint saw with ErrInconsistent.
func Verify(dir string, v note.Verifier, external []byte) (*Report, error) {
	msg, err := os.ReadFile(filepath.Join(dir, CheckpointFile))
	if err != nil {
		return nil, fmt.Errorf("audit verify: read checkpoint: %w", err)
	}
	ck, err := OpenCheckpoint(msg, v)
	if err != nil {
		return nil, fmt.Errorf("audit verify: log checkpoint: %w", err)
	}
	t, rep, err := loadForVerify(dir)
	if err != nil {
		return nil, err
	}
	if err := checkSigned(t, ck); err != nil {
		return nil, err
	}
	rep.Signed, rep.Unsigned, rep.TreeHash, rep.ExternalSize = ck.Size, t.n-ck.Size, ck.Hash.String(), -1
	if external != nil {
		if err := checkExternal(t, ck, external, v); err != nil {
			return nil, err
		}
		ext, _ := OpenCheckpoint(external, v)
		rep.ExternalSize = ext.Size
	}
	return rep, nil
}

// loadForVerify reads the log read-only and builds its tree.
func loadForVerify(dir string) (*tree, *Report, error) {
	f, err := os.Open(filepath.Join(dir, LogFile))
	if err != nil {
		return nil, nil, fmt.Errorf("audit verify: open log: %w", err)
	}
	defer f.Close()
	t, complete, size, err := readTree(f)
	if err != nil {
		return nil, nil, fmt.Errorf("audit verify: %w", err)
	}
	return t, &Report{Records: t.n, TornBytes: size - complete}, nil
}

// checkSigned proves every record of the signed prefix included in the
// checkpoint's tree.
func checkSigned(t *tree, ck Checkpoint) error {
	if ck.Size > t.n {
		return fmt.Errorf("audit verify: %w: the checkpoint covers %d records, the log has %d",
			ErrTruncated, ck.Size, t.n)
	}
	root, err := t.root(ck.Size)
	if err != nil {
		return err
	}
	if root != ck.Hash {
		return fmt.Errorf("audit verify: %w: the first %d records hash to %s, the checkpoint says %s",
			ErrTampered, ck.Size, root, ck.Hash)
	}
	for i := int64(0); i < ck.Size; i++ {
		p, err := tlog.ProveRecord(ck.Size, i, t)
		if err == nil {
			err = tlog.CheckRecord(p, ck.Size, ck.Hash, i, t.hashes[tlog.StoredHashIndex(0, i)])
		}
		if err != nil {
			return fmt.Errorf("audit verify: %w: record %d not included in the signed tree: %w", ErrTampered, i, err)
		}
	}
	return nil
}

// checkExternal proves the log's signed tree consistent with an older
// checkpoint.
func checkExternal(t *tree, ck Checkpoint, external []byte, v note.Verifier) error {
	old, err := OpenCheckpoint(external, v)
	if err != nil {
		return fmt.Errorf("audit verify: external checkpoint: %w", err)
	}
	if old.Size > ck.Size {
		return fmt.Errorf("audit verify: %w: an external checkpoint covers %d records, the log's own only %d "+
			"(records were removed and an older checkpoint put back)", ErrTruncated, old.Size, ck.Size)
	}
	if old.Size == 0 { // the empty tree is a prefix of every tree; tlog proves only sizes >= 1
		if empty, _ := tlog.TreeHash(0, t); old.Hash != empty {
			return fmt.Errorf("audit verify: %w: the external checkpoint of size 0 does not carry the empty tree hash", ErrInconsistent)
		}
		return nil
	}
	p, err := tlog.ProveTree(ck.Size, old.Size, t)
	if err == nil {
		err = tlog.CheckTree(p, ck.Size, ck.Hash, old.Size, old.Hash)
	}
	if err != nil {
		return fmt.Errorf("audit verify: %w: size %d is not a prefix of size %d: %w", ErrInconsistent, old.Size, ck.Size, err)
	}
	return nil
}
