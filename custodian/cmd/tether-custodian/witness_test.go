package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/fixtures/witness"
)

// cli runs tether-custodian with args and returns its exit code and output.
func cli(args ...string) (int, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String() + errb.String()
}

// TestAuditVerifyWithWitnesses: `audit witness` has two witness processes
// cosign the log; `audit verify --witness K1 --witness K2` passes; after
// the custodian rewrites a record and re-signs its checkpoint with its own
// key, plain verify still passes, `audit witness` is refused, and verify
// with the witnesses fails; --witness-quorum above the keys given is a
// usage error.
func TestAuditVerifyWithWitnesses(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "k")
	if code, out := cli("audit", "keygen", "--name", "tether.test/custodian", "--out", prefix); code != 0 {
		t.Fatal(out)
	}
	vkey, _ := os.ReadFile(prefix + ".pub")
	skey, _ := os.ReadFile(prefix + ".key")
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o700)
	appendRecords(t, state, skey, 0, 5)
	w1, w2 := witness.Start(t, "w1.test", strings.TrimSpace(string(vkey))), witness.Start(t, "w2.test", strings.TrimSpace(string(vkey)))
	if code, out := cli("audit", "witness", "--state", state, "--pubkey", prefix+".pub",
		"--witness", w1.URL+"="+w1.VKey, "--witness", w2.URL+"="+w2.VKey); code != 0 || !strings.Contains(out, "cosigned by w1.test, w2.test") {
		t.Fatalf("audit witness = %d: %s", code, out)
	}
	verify := []string{"audit", "verify", "--state", state, "--pubkey", prefix + ".pub", "--witness", w1.VKey, "--witness", w2.VKey}
	if code, out := cli(verify...); code != 0 || !strings.Contains(out, "the first 5 records match") {
		t.Fatalf("verify with witnesses = %d: %s", code, out)
	}
	if code, _ := cli(append(verify, "--witness-quorum", "3")...); code != exitUsage {
		t.Fatalf("quorum above the keys given: exit %d, want %d", code, exitUsage)
	}
	rewriteAndResign(t, state, skey)
	if code, out := cli("audit", "verify", "--state", state, "--pubkey", prefix+".pub"); code != 0 {
		t.Fatalf("the re-signed rewrite should pass the log's own check: %s", out)
	}
	if code, out := cli("audit", "witness", "--state", state, "--pubkey", prefix+".pub", "--witness", w1.URL+"="+w1.VKey); code != exitFailed {
		t.Fatalf("a witness cosigned the rewritten log: %d %s", code, out)
	}
	if code, out := cli(verify...); code != exitFailed || !strings.Contains(out, "FAIL") {
		t.Fatalf("verify with witnesses of the rewritten log = %d: %s", code, out)
	}
}

func appendRecords(t *testing.T, state string, skey []byte, from, to int) {
	t.Helper()
	s, v, err := audit.LoadSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(filepath.Join(state, custodian.AuditDir), audit.Options{Signer: s, Verifier: v})
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < to; i++ {
		if _, err := l.Append(audit.Record{Kind: audit.KindDispatch, SessionID: "s", OpKey: "k" + string(rune('a'+i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// rewriteAndResign edits record 2 and signs a checkpoint over the edited
// log with the custodian's own key: what a custodian hiding an action does.
func rewriteAndResign(t *testing.T, state string, skey []byte) {
	t.Helper()
	dir := filepath.Join(state, custodian.AuditDir)
	data, _ := os.ReadFile(filepath.Join(dir, audit.LogFile))
	ls := bytes.SplitAfter(data, []byte("\n"))
	ls[2] = bytes.Replace(ls[2], []byte(`"kc"`), []byte(`"kz"`), 1)
	os.WriteFile(filepath.Join(dir, audit.LogFile), bytes.Join(ls, nil), 0o600)
	os.Remove(filepath.Join(dir, audit.CheckpointFile))
	s, v, err := audit.LoadSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	// Re-create the log from the edited records so Open signs it afresh.
	os.Remove(filepath.Join(dir, audit.LogFile))
	l, err := audit.Open(dir, audit.Options{Signer: s, Verifier: v})
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range ls {
		if len(line) == 0 {
			continue
		}
		r, err := audit.DecodeRecord(bytes.TrimSuffix(line, []byte("\n")))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(*r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
