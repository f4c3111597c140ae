package routine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/internal/durable"
)

// A routine runs only on a session bound inside a running custodian
// (`tether-custodian run`), so `tether-custodian routine run` asks that
// custodian, as `receipts show` asks it for a snapshot: it drops a
// request file into routines/requests/ (private, in the private state
// directory: whoever can write there can run the custodian itself), the
// custodian's poller claims it by renaming it, runs it once through the
// full custody path, and writes an answer file that the asker reads and
// deletes. A request nobody claimed before the asker gives up is deleted
// by the asker, so it never runs later: no request outlives its asker's
// wait unclaimed.

// Names of the run exchange, inside Dir/requests.
const (
	requestsDir = "requests"
	runPrefix   = "run-"
	extRequest  = ".request"
	extClaimed  = ".claimed"
	extAnswer   = ".answer"
)

// DefaultPoll is how often Serve looks for run requests.
const DefaultPoll = 200 * time.Millisecond

// maxExchangeBytes bounds a request or an answer file.
const maxExchangeBytes = 1 << 20

// ErrNoAnswer: no custodian claimed the request before the asker's wait
// ended; the request was withdrawn and nothing ran.
var ErrNoAnswer = errors.New("routine: no running custodian claimed the run request; it was withdrawn and nothing ran")

// ErrClaimedNoAnswer: a custodian claimed the request and did not answer
// before the asker's wait ended; the run's fate is in its receipt.
var ErrClaimedNoAnswer = errors.New("routine: the custodian claimed the run request but did not answer in time")

// RunRequest asks for one run of routine Name on SessionID under OpKey.
type RunRequest struct {
	Name      string `json:"name"`
	OpKey     string `json:"op_key"`
	SessionID string `json:"session_id"`
}

// RunAnswer is what came of a RunRequest: the run's receipt exactly as
// stored, or the refusal (a tether code when there is one, and the
// message naming the failed check).
type RunAnswer struct {
	Receipt json.RawMessage `json:"receipt,omitempty"`
	Code    string          `json:"code,omitempty"`
	Message string          `json:"message,omitempty"`
}

// exchangeDir returns stateDir's request directory, creating it 0700 and
// refusing one that is not private.
func exchangeDir(stateDir string) (string, error) {
	dir := filepath.Join(stateDir, Dir, requestsDir)
	if err := durable.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("routine: create %s/%s: %w", Dir, requestsDir, err)
	}
	if err := credfile.CheckPrivateDir(dir); err != nil {
		return "", fmt.Errorf("routine: %s/%s: %w", Dir, requestsDir, err)
	}
	return dir, nil
}

// Ask submits req to the custodian serving stateDir and waits, until ctx
// ends, for its answer. Unclaimed at the end, the request is withdrawn
// (ErrNoAnswer); claimed and unanswered, ErrClaimedNoAnswer.
func Ask(ctx context.Context, stateDir string, req RunRequest, poll time.Duration) (*RunAnswer, error) {
	dir, err := exchangeDir(stateDir)
	if err != nil {
		return nil, err
	}
	var id [12]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	base := filepath.Join(dir, runPrefix+hex.EncodeToString(id[:]))
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if err := writeExchange(base+extRequest, data); err != nil {
		return nil, err
	}
	defer os.Remove(base + extAnswer)
	return awaitAnswer(ctx, base, poll)
}

// awaitAnswer polls for base's answer until ctx ends.
func awaitAnswer(ctx context.Context, base string, poll time.Duration) (*RunAnswer, error) {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		var ans RunAnswer
		err := readExchange(base+extAnswer, &ans)
		if err == nil {
			return &ans, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			if os.Remove(base+extRequest) == nil {
				return nil, ErrNoAnswer
			}
			return nil, ErrClaimedNoAnswer
		}
	}
}

// writeExchange writes a request or answer file whole (writeFileAtomic,
// fsynced like every replaced file though its asker would not survive a
// crash either: the one atomic write costs little here).
func writeExchange(path string, data []byte) error {
	if err := writeFileAtomic(path, data); err != nil {
		return fmt.Errorf("routine: write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// readExchange reads and strictly decodes a request or answer file: a
// regular file of this user, 0600 or narrower, no symlink.
func readExchange(path string, v any) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := checkFile(f); err != nil {
		return fmt.Errorf("routine: %s: %w", filepath.Base(path), err)
	}
	if err := strictjson.Read(f, maxExchangeBytes, v); err != nil {
		return fmt.Errorf("routine: %s: %w", filepath.Base(path), err)
	}
	return nil
}

// Serve answers the run requests dropped into stateDir until ctx ends,
// looking every poll: it claims each (a rename, so one server runs it),
// calls run once, and writes its answer. run is called for one request
// at a time. It returns ctx's error, or an error if the request directory
// is not usable.
func Serve(ctx context.Context, stateDir string, poll time.Duration, run func(context.Context, RunRequest) RunAnswer) error {
	dir, err := exchangeDir(stateDir)
	if err != nil {
		return err
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		serveOnce(ctx, dir, run)
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// serveOnce claims and answers every request in dir.
func serveOnce(ctx context.Context, dir string, run func(context.Context, RunRequest) RunAnswer) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, runPrefix) || !strings.HasSuffix(name, extRequest) {
			continue
		}
		base := filepath.Join(dir, strings.TrimSuffix(name, extRequest))
		if os.Rename(base+extRequest, base+extClaimed) != nil {
			continue // withdrawn by its asker
		}
		ans := answer(ctx, base+extClaimed, run)
		data, err := json.Marshal(ans)
		if err == nil {
			_ = writeExchange(base+extAnswer, data)
		}
		_ = os.Remove(base + extClaimed)
	}
}

// answer decodes a claimed request and runs it.
func answer(ctx context.Context, claimed string, run func(context.Context, RunRequest) RunAnswer) RunAnswer {
	var req RunRequest
	if err := readExchange(claimed, &req); err != nil {
		return RunAnswer{Code: "invalid", Message: err.Error()}
	}
	return run(ctx, req)
}
