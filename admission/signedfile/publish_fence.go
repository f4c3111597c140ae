package signedfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// leaderName is the file in the admission directory that holds the
// highest leader revision a fenced publish used (decimal, one line).
const leaderName = ".admission.leader"

// ErrDeposed: a fenced publish named a leader revision lower than one
// already recorded; a later leader has published, so this one is deposed.
// *DeposedError carries both revisions.
var ErrDeposed = errors.New("publish refused: deposed leader")

// DeposedError reports a refused leader revision.
type DeposedError struct {
	Leader, Recorded uint64
}

// Error names both revisions.
func (e *DeposedError) Error() string {
	return fmt.Sprintf("%s: leader revision %d is below %d, which a later leader published with", ErrDeposed, e.Leader, e.Recorded)
}

// Unwrap makes errors.Is(err, ErrDeposed) true.
func (e *DeposedError) Unwrap() error { return ErrDeposed }

// checkLeader refuses leader if it is below the recorded revision. The
// caller holds the publisher lock.
func checkLeader(dir *os.File, leader uint64) error {
	recorded, err := readLeader(dir)
	if err != nil {
		return err
	}
	if leader < recorded {
		return &DeposedError{Leader: leader, Recorded: recorded}
	}
	return nil
}

// readLeader returns the recorded leader revision, 0 if none. A record
// that does not parse stops publishing: guessing could let a deposed
// leader in.
func readLeader(dir *os.File) (uint64, error) {
	f, err := openFileAt(dir, leaderName)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("%w: leader record: %w", ErrPublishDir, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return 0, fmt.Errorf("%w: leader record: %w", ErrPublishDir, err)
	}
	v, err := strconv.ParseUint(strings.TrimSuffix(string(data), "\n"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: leader record %s does not parse (%q): remove it only when no deposed coordinator can still run",
			ErrPublishDir, leaderName, data)
	}
	return v, nil
}

// recordLeader durably records leader: temp file, fsync, rename, fsync of
// the directory.
func recordLeader(dir *os.File, leader uint64) error {
	data := []byte(strconv.FormatUint(leader, 10) + "\n")
	if err := writeAt(dir, leaderName+".tmp-"+randomSuffix(), leaderName, data); err != nil {
		return fmt.Errorf("publish: record leader: %w", err)
	}
	return nil
}
