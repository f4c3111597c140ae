package signedfile

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signing"
)

// t0 is the fixed "now" of tests that do not need the real clock.
var t0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func clockAt(t time.Time) func() time.Time { return func() time.Time { return t } }

func testKey(t testing.TB) signing.PrivateKey {
	t.Helper()
	k, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// adminDir returns a fresh admission directory of mode 0755.
func adminDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "admission")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// exampleTuple is the tuple of docs/admission.md (admission's tests hold
// the same one; test code is copied, not imported).
func exampleTuple() admission.Tuple {
	return admission.Tuple{Owner: "alice", Allocation: "a1", Session: "s1", Workspace: "w1",
		Sandbox: "sb1", Generation: 1, Executor: "e1", Site: "local", Root: "/srv/tether/w1"}
}

func tupleN(n int) admission.Tuple {
	tu := exampleTuple()
	tu.Session = fmt.Sprintf("s%d", n)
	return tu
}

func grantFor(tu admission.Tuple, notAfter time.Time, ops ...admission.Op) admission.Grant {
	if len(ops) == 0 {
		ops = []admission.Op{admission.OpRead, admission.OpWrite, admission.OpList, admission.OpExec, admission.OpKill}
	}
	return admission.Grant{Tuple: tu, UID: 60001, GID: 60001, Groups: []uint32{}, Ops: ops,
		Limits: admission.Limits{MaxProcs: 64, MaxRuntimeS: 600, MaxOutputBytes: 1 << 20, MaxFileBytes: 64 << 20}, NotAfter: notAfter}
}

func inputWith(gen uint64, notAfter time.Time, grants ...admission.Grant) admission.PublishInput {
	in := admission.PublishInput{NotAfter: notAfter, Grants: grants}
	if gen != 0 {
		in.Generation = &gen
	}
	return in
}

func newTestPublisher(t testing.TB, dir string, k signing.PrivateKey, now func() time.Time) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{Dir: dir, Key: k, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustPublish(t testing.TB, p *Publisher, in admission.PublishInput) Published {
	t.Helper()
	pub, err := p.Publish(context.Background(), in)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return pub
}

func uidp(u int) *uint32 { v := uint32(u); return &v }

func newTestLoader(t testing.TB, dir string, pub signing.PublicKey, now func() time.Time) *Loader {
	t.Helper()
	l, err := NewLoader(LoaderConfig{Path: filepath.Join(dir, admission.FileName), PublicKey: pub,
		OwnerUID: uidp(os.Geteuid()), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// writeSigned signs an arbitrary payload (bypassing the publisher's
// validation, as an attacker holding the key or a buggy writer would) and
// writes it as the admission file with mode 0644.
func writeSigned(t testing.TB, dir string, k signing.PrivateKey, payload any) {
	t.Helper()
	var data []byte
	switch p := payload.(type) {
	case string:
		data = []byte(p)
	default:
		var err error
		if data, err = json.Marshal(p); err != nil {
			t.Fatal(err)
		}
	}
	env, err := signing.Sign(context.Background(), admission.PayloadType, data, k)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, admission.FileName)
	if err := os.WriteFile(path, env, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
}
