package receiver

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
)

// FuzzDecodeArgs drives the Handler's argument path: the wire decoder of
// each op's args as the Handler calls it, then (for exec_start) planExec,
// which turns args into what would be started. A plan must never carry a loader variable, an
// unsorted or duplicated environment, a relative executable path (only an
// absolute one, or a bare name searched in absolute directories only), an
// output bound above the grant's or the receiver's, or a deadline past the
// grant's end.
func FuzzDecodeArgs(f *testing.F) {
	seeds := map[wire.Op]string{
		wire.OpRead:        `{"path":"a","line":2,"limit":3}`,
		wire.OpWrite:       `{"path":"a","content":"x","mode":420,"expect_sha256":""}`,
		wire.OpHash:        `{"paths":["a","b"]}`,
		wire.OpExecStart:   `{"argv":["sh","-c","true"],"env":{"PATH":"/usr/bin:/bin","LD_PRELOAD":"x"},"output_limit":5}`,
		wire.OpExecWait:    `{"terminal_id":"t-1"}`,
		wire.OpAttach:      `null`,
		wire.OpList:        `{"path":"."}{"path":"x"}`,
		wire.OpStat:        `{"path":".","PATH":"x"}`,
		wire.OpExecRelease: `[]`,
		wire.OpReadChunk:   `{"path":"a","offset":10,"length":4096}`,
		wire.OpWriteBegin:  `{"path":"a","size":3,"sha256":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`,
		wire.OpWriteChunk:  `{"transfer_id":"w-1","offset":0,"data":"YWJj"}`,
		wire.OpWriteCommit: `{"transfer_id":"w-1"}`,
		wire.OpWriteAbort:  `{"transfer_id":"w-1","x":1}`,
	}
	for op, raw := range seeds {
		f.Add(uint8(slices.Index(wire.Ops, op)), []byte(raw))
	}
	lim, _ := Limits{}.withDefaults()
	h := &Handler{limits: lim}
	now := time.Unix(1_700_000_000, 0)
	g := admission.Grant{NotAfter: now.Add(time.Hour),
		Limits: admission.Limits{MaxProcs: 1, MaxRuntimeS: 60, MaxOutputBytes: 1000, MaxFileBytes: 1000}}
	f.Fuzz(func(t *testing.T, opIndex uint8, raw []byte) {
		op := wire.Ops[int(opIndex)%len(wire.Ops)]
		args, err := decodeArgs(&wire.Request{Op: op, Args: raw})
		if err != nil {
			var we *errcode.Error
			if !errors.As(err, &we) || we.Code != errcode.CodeInvalid {
				t.Fatalf("decode error %v is not invalid", err)
			}
			return
		}
		again, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeArgs(&wire.Request{Op: op, Args: again}); err != nil {
			t.Fatalf("re-encoded args %s refused: %v", again, err)
		}
		a, ok := args.(*wire.ExecStartArgs)
		if !ok {
			return
		}
		req := &wire.Request{Deadline: now.Add(time.Duration(len(raw)) * time.Second)}
		p, err := h.planExec(req, a, g, now)
		if err != nil {
			return
		}
		checkPlan(t, p, g, lim, now)
	})
}

func checkPlan(t *testing.T, p execPlan, g admission.Grant, lim Limits, now time.Time) {
	t.Helper()
	bare := p.path != "" && p.path != "." && p.path != ".." && !strings.Contains(p.path, "/")
	switch {
	case !filepath.IsAbs(p.path) && !bare:
		t.Fatalf("relative executable %q", p.path)
	case filepath.IsAbs(p.path) && len(p.search) > 0:
		t.Fatalf("absolute executable %q with a search list %q", p.path, p.search)
	case slices.ContainsFunc(p.search, func(d string) bool { return !filepath.IsAbs(d) }):
		t.Fatalf("search list %q has a relative directory", p.search)
	case p.limit <= 0 || p.limit > g.Limits.MaxOutputBytes || p.limit > lim.MaxOutputBytes:
		t.Fatalf("output bound %d outside (0, %d]", p.limit, g.Limits.MaxOutputBytes)
	case !p.deadline.After(now) || p.deadline.After(g.NotAfter) || p.deadline.After(now.Add(time.Duration(g.Limits.MaxRuntimeS)*time.Second)):
		t.Fatalf("deadline %v outside (now, grant end]", p.deadline)
	case !slices.IsSorted(p.env):
		t.Fatalf("environment not sorted: %q", p.env)
	}
	seen := map[string]bool{}
	for _, kv := range p.env {
		k, _, _ := strings.Cut(kv, "=")
		if spawn.IsLoaderVar(k) || seen[k] || k == "" {
			t.Fatalf("environment entry %q passed", kv)
		}
		seen[k] = true
	}
}
