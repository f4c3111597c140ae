package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	bolt "go.etcd.io/bbolt"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/custodian/jail"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/fixtures/witness"
)

func TestMain(m *testing.M) {
	jail.HelperMain()        // the jail's init or shell stub (jail_test.go shows this binary as both)
	witness.MaybeRunHelper() // a witness process (witness_test.go)
	testscript.Main(testMain{m}, map[string]func(){
		"tether-custodian": func() {
			os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
		},
		"test-agent": testAgentMain,
	})
}

// testMain removes the binaries realrecv built once the tests ran.
type testMain struct{ m *testing.M }

func (t testMain) Run() int {
	defer realrecv.Cleanup()
	return t.m.Run()
}

// TestScripts runs testdata/script/*.txtar: the CLI without a receiver.
// Scripts are named category-first (custodian_audit_truncated.txtar).
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"audit-append":  cmdAuditAppend,
			"edit-line":     cmdEditLine,
			"seed-receipts": cmdSeedReceipts,
			"hold-receipts": cmdHoldReceipts,
			"hold-lock":     cmdHoldLock,
		},
	})
}

// TestScriptsRoot runs testdata/script-root/*.txtar: `run` end to end
// against a real tether-receiver process (custodian/internal/realrecv),
// which needs root. Scripts get $ROOT (the granted tuple's root) and
// $GRANT_UID (the uid the grant runs commands as), and write their config
// with write-config.
func TestScriptsRoot(t *testing.T) {
	rr := realrecv.Start(t)
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script-root",
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(env *testscript.Env) error {
			env.Setenv("ROOT", rr.Tuple.Root)
			uid, _ := realrecv.GrantIDs()
			env.Setenv("GRANT_UID", strconv.FormatUint(uint64(uid), 10))
			env.Values["receiver"] = rr
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"write-config": cmdWriteConfig,
		},
	})
}

// write-config FILE [FIELD=JSON]... writes a run config for the real
// receiver: the granted tuple, a one-hour lease, state in ./state, the
// audit key ./audit.key, and each FIELD set to the JSON value given.
func cmdWriteConfig(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 {
		ts.Fatalf("usage: write-config FILE [FIELD=JSON]...")
	}
	rr := ts.Value("receiver").(*realrecv.Receiver)
	cfg := map[string]any{
		"tuple": rr.Tuple, "lease_not_after": time.Now().Add(time.Hour).UTC(), "principal": rr.Tuple.Owner,
		"receiver":  map[string]any{"kind": "unix", "path": rr.Sock, "host_only": true},
		"state_dir": "state", "audit_key_file": "audit.key",
	}
	for _, kv := range args[1:] {
		k, v, ok := strings.Cut(kv, "=")
		var val any
		if !ok || json.Unmarshal([]byte(v), &val) != nil {
			ts.Fatalf("write-config: %q is not FIELD=JSON", kv)
		}
		cfg[k] = val
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	ts.Check(err)
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), data, 0o600))
}

// audit-append STATE KEY N appends N records to the audit log of STATE
// (signed with KEY) and closes it, which writes a checkpoint.
func cmdAuditAppend(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: audit-append STATE KEY N")
	}
	skey, err := credfile.Read(ts.MkAbs(args[1]))
	ts.Check(err)
	s, v, err := audit.LoadSigner(skey)
	ts.Check(err)
	n, err := strconv.Atoi(args[2])
	ts.Check(err)
	l, err := audit.Open(filepath.Join(ts.MkAbs(args[0]), custodian.AuditDir), audit.Options{Signer: s, Verifier: v})
	ts.Check(err)
	for i := range n {
		_, err := l.Append(audit.Record{Kind: audit.KindDispatch, SessionID: "s", OpKey: "k" + strconv.Itoa(i),
			Sizes: map[string]int64{"content": int64(i)}})
		ts.Check(err)
	}
	ts.Check(l.Close())
}

// edit-line FILE N OLD NEW replaces OLD with NEW in line N (1-based);
// "swap A B" swaps lines; "cut N" keeps the first N lines.
func cmdEditLine(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: edit-line FILE (N OLD NEW | swap A B | cut N)")
	}
	path := ts.MkAbs(args[0])
	data, err := os.ReadFile(path)
	ts.Check(err)
	lines := strings.SplitAfter(string(data), "\n")
	lines = lines[:len(lines)-1]
	atoi := func(s string) int { n, err := strconv.Atoi(s); ts.Check(err); return n }
	switch {
	case args[1] == "swap" && len(args) == 4:
		a, b := atoi(args[2])-1, atoi(args[3])-1
		lines[a], lines[b] = lines[b], lines[a]
	case args[1] == "cut" && len(args) == 3:
		lines = lines[:atoi(args[2])]
	case len(args) == 4:
		i := atoi(args[1]) - 1
		if !strings.Contains(lines[i], args[2]) {
			ts.Fatalf("edit-line: %q not in line %s", args[2], args[1])
		}
		lines[i] = strings.Replace(lines[i], args[2], args[3], 1)
	default:
		ts.Fatalf("edit-line: bad arguments %q", args)
	}
	ts.Check(os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600))
}

// seed-receipts STATE records a verified write (key w-1) and leaves key
// lost-1 dispatched with no result, as a custodian killed mid-request.
func cmdSeedReceipts(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: seed-receipts STATE")
	}
	dir := filepath.Join(ts.MkAbs(args[0]), custodian.OpKeysDir)
	s, err := opstore.Open(dir, opstore.Options{})
	ts.Check(err)
	ctx := context.Background()
	in := func(key string) opstore.Intent {
		return opstore.Intent{OpKey: key, RequestSHA256: strings.Repeat("a", 64), Method: "fs/write_text_file",
			SessionID: "sess-1", TupleSHA256: strings.Repeat("b", 64), Principal: "alice", LeaseNotAfter: time.Now().Add(time.Hour)}
	}
	t, _, err := s.Begin(ctx, in("w-1"))
	ts.Check(err)
	resp, _ := json.Marshal(map[string]any{})
	ts.Check(t.Finish(&opstore.Receipt{Outcome: opstore.Verified, Response: resp}))
	ts.Check(s.Flush(ctx))
	_, _, err = s.Begin(ctx, in("lost-1"))
	ts.Check(err)
	ts.Check(s.Close()) // lost-1 stays dispatched: its result never came
}

// hold-receipts STATE opens the store of STATE as a running custodian does
// (holding its lock until the script ends), with a verified write (key
// live-1) and a request still in flight (key flying-1).
func cmdHoldReceipts(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: hold-receipts STATE")
	}
	dir := filepath.Join(ts.MkAbs(args[0]), custodian.OpKeysDir)
	s, err := opstore.Open(dir, opstore.Options{SnapshotPoll: 20 * time.Millisecond})
	ts.Check(err)
	ts.Defer(func() { s.Close() })
	ctx := context.Background()
	in := func(key string) opstore.Intent {
		return opstore.Intent{OpKey: key, RequestSHA256: strings.Repeat("c", 64), Method: "fs/write_text_file",
			SessionID: "sess-1", TupleSHA256: strings.Repeat("b", 64), Principal: "alice", LeaseNotAfter: time.Now().Add(time.Hour)}
	}
	t, _, err := s.Begin(ctx, in("live-1"))
	ts.Check(err)
	ts.Check(t.Finish(&opstore.Receipt{Outcome: opstore.Verified, Response: json.RawMessage(`{}`)}))
	_, _, err = s.Begin(ctx, in("flying-1"))
	ts.Check(err)
}

// hold-lock STATE holds the lock of STATE's store without answering
// snapshot requests, as an older custodian would.
func cmdHoldLock(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: hold-lock STATE")
	}
	db, err := bolt.Open(filepath.Join(ts.MkAbs(args[0]), custodian.OpKeysDir, "opkeys.db"), 0o600, &bolt.Options{Timeout: time.Second})
	ts.Check(err)
	ts.Defer(func() { db.Close() })
}
