package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/custodian/opstore"
)

// TestRoutineRunThroughRunningCustodian: a routine saved from a verified
// exec is run by `routine run` through the custodian a second `run`
// holds: exactly once per op key (runs.txt counts the side effect), on
// the session it bound, verified again; a retry replays; a session it did
// not bind is not_admitted; with no custodian running nothing runs. The
// audit log verifies and holds the template's digest for the save and
// each run.
func TestRoutineRunThroughRunningCustodian(t *testing.T) {
	rr := realrecv.Start(t) // requires root
	dir := t.TempDir()
	skey, vkey, err := audit.GenerateKey("tether.test/custodian")
	realrecv.Must(t, err)
	keyPath, cfgPath, state := filepath.Join(dir, "audit.key"), filepath.Join(dir, "c.json"), filepath.Join(dir, "state")
	realrecv.Must(t, os.WriteFile(keyPath, []byte(skey+"\n"), 0o600))
	realrecv.Must(t, os.WriteFile(filepath.Join(dir, "audit.pub"), []byte(vkey+"\n"), 0o600))
	cfg, _ := json.Marshal(map[string]any{
		"tuple": rr.Tuple, "lease_not_after": time.Now().Add(time.Hour).UTC(), "principal": rr.Tuple.Owner,
		"receiver":  map[string]any{"kind": "unix", "path": rr.Sock, "host_only": true},
		"state_dir": state, "audit_key_file": keyPath,
	})
	realrecv.Must(t, os.WriteFile(cfgPath, cfg, 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runs := func() int {
		data, err := os.ReadFile(rr.File("runs.txt"))
		if errors.Is(err, os.ErrNotExist) {
			return 0
		}
		realrecv.Must(t, err)
		return strings.Count(string(data), "ran\n")
	}
	routineCLI(t, ctx, 0, "run", "--config", cfgPath, "--no-jail", "--prompt",
		"key=k-src verify=out.txt:"+sha256Hex("ok")+" sh echo ran >> runs.txt && printf ok > out.txt", "--", "test-agent")
	out := routineCLI(t, ctx, 0, "routine", "save", "build", "--from", "k-src:create", "--config", cfgPath)
	digest := strings.TrimSpace(out[strings.LastIndex(out, " ")+1:])
	if out := routineCLI(t, ctx, exitRuntime, "routine", "run", "build", "--op-key", "again-1", "--session-id", "sess-1", "--state", state); !strings.Contains(out, "no custodian runs") || runs() != 1 {
		t.Fatalf("routine run without a custodian: %s (%d runs)", out, runs())
	}

	stop := holdRun(t, ctx, cfgPath, state)
	out = routineCLI(t, ctx, 0, "routine", "run", "build", "--op-key", "again-1", "--session-id", "sess-1", "--state", state, "--wait", "30s")
	if !strings.Contains(out, `"outcome":"verified"`) || !strings.Contains(out, `"op_key":"again-1"`) || runs() != 2 {
		t.Fatalf("routine run: %s (%d runs, want 2)", out, runs())
	}
	routineCLI(t, ctx, 0, "routine", "run", "build", "--op-key", "again-1", "--session-id", "sess-1", "--state", state, "--wait", "30s")
	if runs() != 2 {
		t.Fatalf("a retry of op key again-1 ran the routine again (%d runs)", runs())
	}
	if out := routineCLI(t, ctx, exitFailed, "routine", "run", "build", "--op-key", "again-2", "--session-id", "sess-other", "--state", state, "--wait", "30s"); !strings.Contains(out, "not_admitted") || runs() != 2 {
		t.Fatalf("run on a session not bound: %s (%d runs)", out, runs())
	}
	stop()
	routineCLI(t, ctx, 0, "audit", "verify", "--state", state, "--pubkey", filepath.Join(dir, "audit.pub"))
	if got := routineRecords(t, state, digest); got["saved k-src:create"] != 1 || got["run again-1"] != 2 {
		t.Fatalf("routine records with digest %s: %v", digest, got)
	}
}

// routineCLI runs the command line and fails unless it exits want; it returns
// stdout and stderr together.
func routineCLI(t *testing.T, ctx context.Context, want int, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if code := run(ctx, args, strings.NewReader(""), &out, &out); code != want {
		t.Fatalf("%s: exit %d, want %d\n%s", strings.Join(args, " "), code, want, &out)
	}
	return out.String()
}

// holdRun starts a `run` whose stdin stays open, so it holds the state
// and its bound session until stop, and waits until it holds the state.
func holdRun(t *testing.T, ctx context.Context, cfgPath, state string) (stop func()) {
	t.Helper()
	inR, inW := io.Pipe()
	var stderr syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- cmdRun(ctx, []string{"--config", cfgPath, "--no-jail", "--", "test-agent"}, inR, io.Discard, &stderr)
	}()
	for {
		_, err := opstore.ReadOnly(filepath.Join(state, custodian.OpKeysDir))
		if errors.Is(err, opstore.ErrLocked) {
			break
		}
		select {
		case c := <-code:
			t.Fatalf("run ended with %d before holding the state: %s", c, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return func() {
		_, err := io.WriteString(inW, "sh true\n") // a run needs one prompt to end with exit 0
		realrecv.Must(t, err)
		inW.Close()
		if c := <-code; c != exitOK {
			t.Errorf("held run exited %d: %s", c, stderr.String())
		}
	}
}

// routineRecords counts the routine records of state's audit log that
// carry digest, by "OUTCOME OPKEY".
func routineRecords(t *testing.T, state, digest string) map[string]int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(state, custodian.AuditDir, audit.LogFile))
	realrecv.Must(t, err)
	got := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, audit.MaxRecordBytes+1)
	for sc.Scan() {
		r, err := audit.DecodeRecord(sc.Bytes())
		realrecv.Must(t, err)
		if r.Kind == audit.KindRoutine && r.Digests["template"] == digest {
			got[r.Outcome+" "+r.OpKey]++
		}
	}
	return got
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
