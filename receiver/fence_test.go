package receiver

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
)

// fencedFixture is a fixture whose handler keeps its fence state in a
// fresh directory; it returns the state file's path.
func fencedFixture(t *testing.T) (*fixture, string) {
	t.Helper()
	testenv.Require(t, "root")
	dir := filepath.Join(t.TempDir(), "fence")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "fence.json")
	return newFixture(t, Options{FenceState: path}), path
}

// callFenced sends one request for g carrying token tok.
func (f *fixture) callFenced(g admission.Grant, tok uint64, op wire.Op, args any) (any, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		f.t.Fatal(err)
	}
	n := f.seq.Add(1)
	req := &wire.Request{ID: uint64(n), Op: op, TupleSHA256: g.Tuple.SHA256(), OpKey: "k-" + strconv.FormatInt(n, 10),
		Fence: tok, Deadline: f.clk.Now().Add(30 * time.Second), Args: raw}
	return f.h.Serve(context.Background(), req)
}

// stateTokens reads the fence state file as the next start would.
func stateTokens(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	st, err := readFenceState(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Tokens
}

// TestFenceRefusesLowerToken attacks a tuple that has seen token 5 with
// every op carrying a lower token and with no token at all: each is
// refused as fenced and leaves no file and no process. Token 5 and a
// higher one are served; another tuple is not affected. The token is in
// the state file before the request that raised it answers.
func TestFenceRefusesLowerToken(t *testing.T) {
	f, path := fencedFixture(t)
	other := f.newGrant("other", allOps...)
	f.publish(f.grant, other)
	if _, err := f.callFenced(f.grant, 0, wire.OpStat, wire.StatArgs{Path: "."}); err != nil {
		t.Fatalf("no token before any was seen (single-machine mode): %v", err)
	}
	if _, err := f.callFenced(f.grant, 5, wire.OpAttach, wire.AttachArgs{}); err != nil {
		t.Fatalf("first token: %v", err)
	}
	if got := stateTokens(t, path)[f.grant.Tuple.SHA256()]; got != 5 {
		t.Fatalf("state file holds %d, want 5 before the answer", got)
	}
	os.WriteFile(filepath.Join(f.grant.Tuple.Root, "f"), []byte("x\n"), 0o644)
	for op, args := range sideEffectArgs {
		for _, tok := range []uint64{0, 1, 4} {
			if _, err := f.callFenced(f.grant, tok, op, args); code(err) != errcode.CodeFenced {
				t.Errorf("%s with token %d after 5: %v, want fenced", op, tok, err)
			}
		}
	}
	if _, err := f.callFenced(f.grant, 4, wire.OpAttach, wire.AttachArgs{}); code(err) != errcode.CodeFenced {
		t.Errorf("attach with a lower token: %v, want fenced", err)
	}
	if _, err := os.Lstat(filepath.Join(f.grant.Tuple.Root, "trace")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a fenced request left a trace")
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("a fenced exec_start left processes %v", ps)
	}
	for _, tok := range []uint64{5, 9} {
		if _, err := f.callFenced(f.grant, tok, wire.OpWrite, wire.WriteArgs{Path: "w" + strconv.FormatUint(tok, 10), Content: "x"}); err != nil {
			t.Fatalf("write with token %d: %v", tok, err)
		}
	}
	if _, err := f.callFenced(f.grant, 5, wire.OpStat, wire.StatArgs{Path: "."}); code(err) != errcode.CodeFenced {
		t.Fatalf("token 5 after 9: %v, want fenced", err)
	}
	if _, err := f.callFenced(other, 0, wire.OpStat, wire.StatArgs{Path: "."}); err != nil {
		t.Fatalf("another tuple without a token: %v", err)
	}
	if got := stateTokens(t, path); len(got) != 1 || got[f.grant.Tuple.SHA256()] != 9 {
		t.Fatalf("state %v, want only the tuple at 9", got)
	}
}

// TestFenceSurvivesRestart: a handler started again on the same state file
// refuses the tokens below the highest its predecessor saw.
func TestFenceSurvivesRestart(t *testing.T) {
	f, path := fencedFixture(t)
	if _, err := f.callFenced(f.grant, 7, wire.OpAttach, wire.AttachArgs{}); err != nil {
		t.Fatal(err)
	}
	f.h.Close()
	h, err := NewHandler(Options{Grants: f.h.grants, Now: f.clk.Now, FenceState: path})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	f.h = h
	if _, err := f.callFenced(f.grant, 6, wire.OpWrite, wire.WriteArgs{Path: "trace", Content: "x"}); code(err) != errcode.CodeFenced {
		t.Fatalf("token 6 after a restart that saw 7: %v, want fenced", err)
	}
	if _, err := f.callFenced(f.grant, 0, wire.OpStat, wire.StatArgs{Path: "."}); code(err) != errcode.CodeFenced {
		t.Fatalf("no token after a restart that saw 7: %v, want fenced", err)
	}
	if _, err := os.Lstat(filepath.Join(f.grant.Tuple.Root, "trace")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a fenced write ran")
	}
	if _, err := f.callFenced(f.grant, 7, wire.OpStat, wire.StatArgs{Path: "."}); err != nil {
		t.Fatalf("token 7 after the restart: %v", err)
	}
}

// TestFenceRaiseKillsOlderCommands: a command started under token 5 is
// killed by the first request that carries token 6 for its tuple.
func TestFenceRaiseKillsOlderCommands(t *testing.T) {
	f, _ := fencedFixture(t)
	res, err := f.callFenced(f.grant, 5, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.(*wire.ExecStartResult).TerminalID
	if _, err := f.callFenced(f.grant, 6, wire.OpAttach, wire.AttachArgs{}); err != nil {
		t.Fatal(err)
	}
	term := f.h.terms.get(f.grant.Tuple.SHA256(), id)
	select {
	case <-term.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the old owner's command still runs after the token was raised")
	}
	if st := term.status(); st == nil || st.Signal != "KILL" {
		t.Fatalf("exit %+v, want KILL", st)
	}
	if _, err := f.callFenced(f.grant, 5, wire.OpExecOutput, wire.TerminalArgs{TerminalID: id}); code(err) != errcode.CodeFenced {
		t.Fatalf("the old owner's exec_output: %v, want fenced", err)
	}
}

// TestFenceWithoutStateRefusesTokens: a receiver that keeps no fence
// state refuses every token (it could not keep it across a restart) and
// still serves requests without one.
func TestFenceWithoutStateRefusesTokens(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	if _, err := f.callFenced(f.grant, 3, wire.OpWrite, wire.WriteArgs{Path: "trace", Content: "x"}); code(err) != errcode.CodeDenied {
		t.Fatalf("token without fence state: %v, want denied", err)
	}
	if _, err := os.Lstat(filepath.Join(f.grant.Tuple.Root, "trace")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a refused write ran")
	}
	if _, err := f.callFenced(f.grant, 0, wire.OpStat, wire.StatArgs{Path: "."}); err != nil {
		t.Fatalf("no token: %v", err)
	}
}

// TestFenceStateNotWrittenRunsNothing: when the raised token cannot be
// made durable, the request is refused and nothing runs.
func TestFenceStateNotWrittenRunsNothing(t *testing.T) {
	f, path := fencedFixture(t)
	if err := os.RemoveAll(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.callFenced(f.grant, 3, wire.OpWrite, wire.WriteArgs{Path: "trace", Content: "x"}); code(err) != errcode.CodeInternal {
		t.Fatalf("token whose state cannot be written: %v, want internal", err)
	}
	if _, err := os.Lstat(filepath.Join(f.grant.Tuple.Root, "trace")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a request whose token was not recorded ran")
	}
	if f.h.fences.current(f.grant.Tuple.SHA256()) != 0 {
		t.Fatal("a token that was not recorded was raised in memory")
	}
}

// TestFenceConcurrentRaises: concurrent requests with tokens in any order
// leave the highest in memory and on disk, and every refusal is of a
// token below one already admitted.
func TestFenceConcurrentRaises(t *testing.T) {
	f, path := fencedFixture(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var admitted, refused []uint64
	for tok := uint64(1); tok <= 40; tok++ {
		wg.Go(func() {
			_, err := f.callFenced(f.grant, tok, wire.OpStat, wire.StatArgs{Path: "."})
			mu.Lock()
			defer mu.Unlock()
			switch code(err) {
			case "":
				admitted = append(admitted, tok)
			case errcode.CodeFenced:
				refused = append(refused, tok)
			default:
				t.Errorf("token %d: %v", tok, err)
			}
		})
	}
	wg.Wait()
	high := uint64(0)
	for _, a := range admitted {
		high = max(high, a)
	}
	for _, r := range refused {
		if r >= high {
			t.Errorf("token %d refused, but no higher token was admitted", r)
		}
	}
	if high != 40 || stateTokens(t, path)[f.grant.Tuple.SHA256()] != 40 || f.h.fences.current(f.grant.Tuple.SHA256()) != 40 {
		t.Fatalf("highest admitted %d, state %v", high, stateTokens(t, path))
	}
}

// TestFenceStateRefusals: a state file that is not strictly what the
// receiver wrote, or that others could have changed, stops the start.
func TestFenceStateRefusals(t *testing.T) {
	d := strings.Repeat("a", 64)
	write := func(t *testing.T, content string, mode os.FileMode) string {
		dir := filepath.Join(t.TempDir(), "fence")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "fence.json")
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	cases := map[string]string{
		"not json":        `{"version":1,`,
		"unknown field":   `{"version":1,"tokens":{},"extra":1}`,
		"duplicate key":   `{"version":1,"tokens":{"` + d + `":3,"` + d + `":1}}`,
		"zero token":      `{"version":1,"tokens":{"` + d + `":0}}`,
		"negative token":  `{"version":1,"tokens":{"` + d + `":-1}}`,
		"bad digest":      `{"version":1,"tokens":{"ABC":3}}`,
		"other version":   `{"version":2,"tokens":{}}`,
		"tokens missing":  `{"version":1}`,
		"trailing data":   `{"version":1,"tokens":{}} {}`,
		"case-folded key": `{"Version":1,"tokens":{}}`,
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := openFences(write(t, content, 0o600)); !errors.Is(err, ErrFenceState) {
				t.Fatalf("opened: %v", err)
			}
		})
	}
	t.Run("group readable", func(t *testing.T) {
		if _, err := openFences(write(t, `{"version":1,"tokens":{}}`, 0o640)); !errors.Is(err, ErrFenceState) {
			t.Fatalf("opened: %v", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		p := write(t, `{"version":1,"tokens":{}}`, 0o600)
		link := filepath.Join(filepath.Dir(p), "link.json")
		os.Symlink(p, link)
		if _, err := openFences(link); !errors.Is(err, ErrFenceState) {
			t.Fatalf("opened through a symlink: %v", err)
		}
	})
	t.Run("writable directory", func(t *testing.T) {
		p := write(t, `{"version":1,"tokens":{}}`, 0o600)
		os.Chmod(filepath.Dir(p), 0o777)
		if _, err := openFences(p); !errors.Is(err, ErrFenceState) {
			t.Fatalf("opened in a world-writable directory: %v", err)
		}
	})
	t.Run("valid", func(t *testing.T) {
		f, err := openFences(write(t, `{"version":1,"tokens":{"`+d+`":3}}`, 0o600))
		if err != nil || f.current(d) != 3 {
			t.Fatalf("valid state: %v", err)
		}
	})
}

// FuzzFenceState: the state file's decoder never panics, and whatever it
// accepts holds only tuple digests with tokens above 0.
func FuzzFenceState(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		st, err := decodeFenceState(in)
		if err != nil {
			return
		}
		for d, tok := range st.Tokens {
			if !wire.ValidDigest(d) || tok == 0 {
				t.Fatalf("accepted %q: %d", d, tok)
			}
		}
		if st.Version != fenceStateVersion {
			t.Fatalf("accepted version %d", st.Version)
		}
	})
}
