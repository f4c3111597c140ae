package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/mod/sumdb/note"

	"github.com/tetherdev/tether/fixtures/witness"
)

func TestMain(m *testing.M) {
	witness.MaybeRunHelper()
	os.Exit(m.Run())
}

// resign signs a checkpoint over whatever the log in dir now holds, as a
// custodian that rewrote its own log (it has its own key) would.
func resign(t *testing.T, dir string, k keys) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, _, _, err := readTree(f)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := tr.root(tr.n)
	msg, err := SignCheckpoint(Checkpoint{Origin: k.s.Name(), Size: tr.n, Hash: root}, k.s)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(dir, CheckpointFile, msg); err != nil {
		t.Fatal(err)
	}
}

func copyDir(t *testing.T, dir string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "audit")
	if out, err := exec.Command("cp", "-a", dir, to).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	return to
}

// TestWitnessesCatchRewriteAndTruncation runs three witnesses as real HTTP
// processes on loopback. A log they cosigned (2 of 3 required) verifies;
// it grows and is cosigned again through a consistency proof. Then a
// custodian rewrites one record and re-signs its checkpoint with its own
// key, and another truncates and re-signs: both pass the log's own
// signature check, the witnesses refuse to cosign either, and the check
// against the witnessed checkpoint fails (edited / truncated). A deleted
// or self-made cosigned checkpoint fails for want of cosignatures.
func TestWitnessesCatchRewriteAndTruncation(t *testing.T) {
	k, vkey := keysWithVKey(t, "tether.test/custodian-1")
	var ws []Witness
	var wvs []note.Verifier
	for _, name := range []string{"w1.test", "w2.test", "w3.test"} {
		p := witness.Start(t, name, vkey)
		v, err := LoadWitnessKey(p.VKey)
		if err != nil {
			t.Fatal(err)
		}
		ws, wvs = append(ws, Witness{URL: p.URL, Verifier: v}), append(wvs, v)
	}
	ctx := context.Background()
	dir := writeLog(t, k, 8)
	if names, err := Cosign(ctx, dir, k.v, ws, 2, nil); err != nil || len(names) != 3 {
		t.Fatalf("Cosign = %v, %v; want all three", names, err)
	}
	if n, err := CheckWitnessed(dir, k.v, wvs, 2); err != nil || n != 8 {
		t.Fatalf("witnessed check = %d, %v", n, err)
	}
	l := openLog(t, dir, k) // the log grows; the witnesses see a consistent extension
	for i := 8; i < 12; i++ {
		l.Append(rec(i))
	}
	l.Close()
	if _, err := Cosign(ctx, dir, k.v, ws, 3, nil); err != nil {
		t.Fatalf("Cosign after growth: %v", err)
	}
	t.Run("rewrite", func(t *testing.T) {
		d := copyDir(t, dir)
		ls := lines(t, d)
		ls[3] = bytes.Replace(ls[3], []byte(`"k3"`), []byte(`"kX"`), 1)
		writeLines(t, d, ls)
		resign(t, d, k)
		attackRefused(t, d, k, ws, wvs, ErrTampered)
	})
	t.Run("truncate", func(t *testing.T) {
		d := copyDir(t, dir)
		writeLines(t, d, lines(t, d)[:9])
		resign(t, d, k)
		attackRefused(t, d, k, ws, wvs, ErrTruncated)
	})
	t.Run("cosigned_deleted_or_forged", func(t *testing.T) {
		d := copyDir(t, dir)
		os.Remove(filepath.Join(d, CosignedFile))
		if _, err := CheckWitnessed(d, k.v, wvs, 1); !errors.Is(err, ErrWitnessQuorum) {
			t.Fatalf("no cosigned checkpoint: %v, want ErrWitnessQuorum", err)
		}
		own, _ := os.ReadFile(filepath.Join(d, CheckpointFile))
		os.WriteFile(filepath.Join(d, CosignedFile), own, 0o600)
		if _, err := CheckWitnessed(d, k.v, wvs, 1); !errors.Is(err, ErrWitnessQuorum) {
			t.Fatalf("self-signed only: %v, want ErrWitnessQuorum", err)
		}
	})
}

// attackRefused: the re-signed log passes its own check, the witnesses
// refuse it, and the witnessed check fails with want.
func attackRefused(t *testing.T, d string, k keys, ws []Witness, wvs []note.Verifier, want error) {
	t.Helper()
	if _, err := Verify(d, k.v, nil); err != nil {
		t.Fatalf("the re-signed log fails its own check (%v): the attack is not the one meant", err)
	}
	if names, err := Cosign(context.Background(), d, k.v, ws, 1, nil); !errors.Is(err, ErrWitnessQuorum) || len(names) != 0 {
		t.Fatalf("witnesses cosigned the attacked log: %v, %v", names, err)
	}
	if _, err := CheckWitnessed(d, k.v, wvs, 2); !errors.Is(err, want) {
		t.Fatalf("witnessed check of the attacked log: %v, want %v", err, want)
	}
}

// keysWithVKey returns a log key pair and the verifier key's text.
func keysWithVKey(t *testing.T, name string) (keys, string) {
	t.Helper()
	skey, vkey, err := GenerateKey(name)
	if err != nil {
		t.Fatal(err)
	}
	s, v, err := LoadSigner([]byte(skey))
	if err != nil {
		t.Fatal(err)
	}
	return keys{s, v}, vkey
}
