package custodian

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/custodian/opstore"
)

// TestIntegrationCrashWithOpsInFlight SIGKILLs a custodian process while
// 32 keyed execs are in flight together, their intents sharing the store's
// fdatasyncs: the first exec to get its result kills the process, the
// others are wherever they are (before their intent, waiting for a shared
// sync, sent, answered). Each exec appends one line to a file of its own.
// Then, on a restarted custodian, each is retried twice with its op key:
//   - nothing ran without a durable intent (intent before send);
//   - a key whose intent was durable is never run again: its retries are
//     answered from its receipt or interrupted, both alike (none lost,
//     none replayed as a new run);
//   - a key with no durable intent was never sent, runs once on its first
//     retry, and its second retry replays that run.
func TestIntegrationCrashWithOpsInFlight(t *testing.T) {
	const n = 32
	rr := startReceiver(t)
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	must(t, err)
	hc := helperConfig{State: filepath.Join(t.TempDir(), "state"), Key: skey, Sock: rr.sock, Tuple: rr.tuple,
		CrashAt: "after-result", CrashIn: acp.ClientMethodTerminalCreate}
	reqs := make([]acp.CreateTerminalRequest, n)
	for i := range reqs {
		reqs[i] = acp.CreateTerminalRequest{SessionId: "sess-crash", Command: "/bin/sh",
			Args: []string{"-c", fmt.Sprintf("echo once >> inflight-%02d", i)}, Cwd: &rr.tuple.Root,
			Meta: acpmeta.Op{TupleSHA256: rr.tuple.SHA256(), OpKey: fmt.Sprintf("inflight-%02d", i),
				Deadline: time.Now().Add(time.Minute)}.Meta()}
	}

	p := spawnCustodian(t, hc)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.agent.conn.CreateTerminal(context.Background(), reqs[i]) // every answer is lost or an error
		}()
	}
	wg.Wait()
	wantSIGKILL(t, p.cmd.Wait(), "after-result with 32 in flight")
	rs, err := opstore.ReadOnly(filepath.Join(hc.State, OpKeysDir))
	must(t, err)
	durable := map[string]*opstore.Receipt{}
	for _, r := range rs {
		durable[r.OpKey] = r
	}
	if len(durable) == 0 {
		t.Fatal("no intent was durable, yet an exec reached its result")
	}

	hc.CrashAt = ""
	p = spawnCustodian(t, hc)
	ranAgain := map[int]bool{}
	for i, req := range reqs {
		key := fmt.Sprintf("inflight-%02d", i)
		first, err1 := p.agent.conn.CreateTerminal(context.Background(), req)
		second, err2 := p.agent.conn.CreateTerminal(context.Background(), req)
		c1, _ := acperr.CodeOf(err1)
		c2, _ := acperr.CodeOf(err2)
		if _, ok := durable[key]; ok {
			if (err1 == nil) != (err2 == nil) || c1 != c2 || err1 == nil && first.TerminalId != second.TerminalId {
				t.Errorf("%s (durable intent): retries %v/%v and %v/%v, want the same replay twice", key, first.TerminalId, err1, second.TerminalId, err2)
			}
			if err1 != nil && c1 != errcode.CodeInterrupted {
				t.Errorf("%s (durable intent): retry %v, want its receipt or interrupted", key, err1)
			}
			continue
		}
		if err1 != nil || err2 != nil || first.TerminalId != second.TerminalId {
			t.Errorf("%s (no durable intent): retries %v/%v and %v/%v, want one run, then its replay", key, first.TerminalId, err1, second.TerminalId, err2)
		}
		ranAgain[i] = true
	}
	realrecv.WaitChildrenGone(t)
	must(t, p.stop())
	interrupted := 0
	for i := range reqs {
		key := fmt.Sprintf("inflight-%02d", i)
		data, _ := os.ReadFile(rr.file(key))
		lines := strings.Count(string(data), "once\n")
		switch {
		case lines > 1:
			t.Errorf("%s ran %d times", key, lines)
		case ranAgain[i] && lines != 1:
			t.Errorf("%s had no durable intent and ran %d times in all, want exactly its retry's run", key, lines)
		case !ranAgain[i] && durable[key] == nil && lines > 0:
			t.Errorf("%s ran without a durable intent", key)
		}
		if r := durable[key]; r != nil && r.Outcome == opstore.Interrupted {
			interrupted++
		}
	}
	t.Logf("at the kill: %d of %d intents durable (%d interrupted); %d never recorded, run once on retry", len(durable), n, interrupted, len(ranAgain))
}
