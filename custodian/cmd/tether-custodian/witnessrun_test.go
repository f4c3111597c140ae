package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian/internal/realrecv"
	"github.com/tetherdev/tether/fixtures/witness"
)

// hungWitness listens on loopback, accepts connections and never
// answers: a witness that hangs.
func hungWitness(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	realrecv.Must(t, err)
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// witnessRun writes a run config for rr in dir with three witness
// processes (quorum 2) for its audit key, takes down the first `down` of
// them from the end (w3 killed; w2 replaced by a hung listener), runs
// one prompt that writes a file in the computer, and returns the
// witnesses' keys, the exit code and stderr.
func witnessRun(t *testing.T, rr *realrecv.Receiver, dir string, down int) ([]string, int, string) {
	t.Helper()
	cfgPath := runConfig(t, rr, dir)
	pub, err := os.ReadFile(filepath.Join(dir, "audit.pub"))
	realrecv.Must(t, err)
	var keys []string
	var ws []map[string]string
	for _, name := range []string{"w1.test", "w2.test", "w3.test"} {
		p := witness.Start(t, name, strings.TrimSpace(string(pub)))
		keys, ws = append(keys, p.VKey), append(ws, map[string]string{"url": p.URL, "vkey": p.VKey})
		if name == "w3.test" && down >= 1 {
			p.Kill()
		}
	}
	if down >= 2 {
		ws[1]["url"] = hungWitness(t)
	}
	var cfg map[string]any
	data, _ := os.ReadFile(cfgPath)
	realrecv.Must(t, json.Unmarshal(data, &cfg))
	cfg["witnesses"], cfg["witness_quorum"] = ws, 2
	data, _ = json.Marshal(cfg)
	realrecv.Must(t, os.WriteFile(cfgPath, data, 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr syncBuffer
	code := run(ctx, []string{"run", "--config", cfgPath, "--no-jail", "--prompt", "write ROOT/" + filepath.Base(dir) + ".txt witnessed", "--", "test-agent"},
		nil, &stdout, &stderr)
	if data, err := os.ReadFile(rr.File(filepath.Base(dir) + ".txt")); err != nil || string(data) != "witnessed\n" {
		t.Errorf("the prompt's write in the computer: %q, %v (stderr: %s)", data, err, stderr.String())
	}
	return keys, code, stderr.String()
}

// verifyWitnessedRun runs audit verify with the three keys and quorum 2.
func verifyWitnessedRun(dir string, keys []string) (int, string) {
	return cli("audit", "verify", "--state", filepath.Join(dir, "state"), "--pubkey", filepath.Join(dir, "audit.pub"),
		"--witness", keys[0], "--witness", keys[1], "--witness", keys[2], "--witness-quorum", "2")
}

// TestIntegrationRunWitnessesCheckpoints: `run` with three witness
// processes in its config (quorum 2) has its checkpoints cosigned by
// itself: afterwards `audit verify --witness K1 K2 K3 --witness-quorum 2`
// passes over every record of the run (its final checkpoint was
// witnessed) with no `audit witness` run by hand. With w3 down the
// quorum is still reached and w3's failure is logged by name. With w3
// down and w2 hanging, the run's callbacks still complete (the prompt's
// write lands, exit 0), the missed quorum is logged, and verify with
// quorum 2 fails for want of cosignatures.
func TestIntegrationRunWitnessesCheckpoints(t *testing.T) {
	rr := realrecv.Start(t) // requires root
	records := regexp.MustCompile(`OK: (\d+) records, (\d+) covered`)
	witnessed := regexp.MustCompile(`OK: the first (\d+) records match the checkpoint 2 of 3`)
	for _, c := range []struct {
		name string
		down int
	}{{"all_up", 0}, {"one_down", 1}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			keys, code, stderr := witnessRun(t, rr, dir, c.down)
			if code != exitOK {
				t.Fatalf("run exit %d:\n%s", code, stderr)
			}
			if !strings.Contains(stderr, "audit checkpoint witnessed") {
				t.Errorf("no witnessed line on stderr:\n%s", stderr)
			}
			if c.down == 1 && !strings.Contains(stderr, "witness=w3.test") {
				t.Errorf("w3's failure is not logged by name:\n%s", stderr)
			}
			code, out := verifyWitnessedRun(dir, keys)
			r, w := records.FindStringSubmatch(out), witnessed.FindStringSubmatch(out)
			if code != exitOK || r == nil || w == nil {
				t.Fatalf("audit verify with the witnesses = %d:\n%s\nrun's stderr:\n%s", code, out, stderr)
			}
			if r[1] != r[2] || w[1] != r[1] || r[1] == "0" {
				t.Fatalf("the witnessed checkpoint covers %s records, the log has %s (signed %s): the run's final checkpoint was not witnessed\n%s", w[1], r[1], r[2], out)
			}
		})
	}
	t.Run("two_down", func(t *testing.T) {
		dir := t.TempDir()
		keys, code, stderr := witnessRun(t, rr, dir, 2)
		if code != exitOK {
			t.Fatalf("run exit %d with two witnesses down, want 0 (nothing waits for witnesses):\n%s", code, stderr)
		}
		if !strings.Contains(stderr, "quorum not reached") {
			t.Errorf("the missed quorum is not logged:\n%s", stderr)
		}
		if code, out := verifyWitnessedRun(dir, keys); code != exitFailed || !strings.Contains(out, "not enough witness cosignatures") {
			t.Fatalf("audit verify with quorum 2 of a run two witnesses missed = %d, want %d naming too few cosignatures:\n%s", code, exitFailed, out)
		}
	})
}
