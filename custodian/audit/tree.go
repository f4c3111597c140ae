package audit

import (
	"fmt"

	"golang.org/x/mod/sumdb/tlog"
)

// tree holds the tlog stored hashes of a log in memory (two hashes per
// record on average) and answers tlog's HashReader.
type tree struct {
	n      int64
	hashes []tlog.Hash
}

var _ tlog.HashReader = (*tree)(nil)

// add appends one record's data as leaf n.
func (t *tree) add(data []byte) error {
	hs, err := tlog.StoredHashes(t.n, data, t)
	if err != nil {
		return fmt.Errorf("audit: hash record %d: %w", t.n, err)
	}
	t.hashes = append(t.hashes, hs...)
	t.n++
	return nil
}

// ReadHashes returns the stored hashes at the given indexes.
func (t *tree) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		if x < 0 || x >= int64(len(t.hashes)) {
			return nil, fmt.Errorf("audit: stored hash %d not available (have %d)", x, len(t.hashes))
		}
		out[i] = t.hashes[x]
	}
	return out, nil
}

// root returns the tree hash of the first n records.
func (t *tree) root(n int64) (tlog.Hash, error) {
	if n > t.n {
		return tlog.Hash{}, fmt.Errorf("audit: tree of %d records asked, log has %d", n, t.n)
	}
	return tlog.TreeHash(n, t)
}
