package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/realrecv"
)

// TestRunSendsEachStdinLineAsItArrives feeds `run` its prompts through a
// pipe that stays open: the first prompt must be sent, and its write done
// in the computer, before the second line is even written; closing stdin
// then ends the run with exit 0. A run that reads stdin to EOF first never
// answers the first line.
func TestRunSendsEachStdinLineAsItArrives(t *testing.T) {
	rr := realrecv.Start(t) // requires root
	dir := t.TempDir()
	skey, _, err := audit.GenerateKey("tether.test/custodian")
	if err != nil {
		t.Fatal(err)
	}
	keyPath, cfgPath := filepath.Join(dir, "audit.key"), filepath.Join(dir, "c.json")
	realrecv.Must(t, os.WriteFile(keyPath, []byte(skey+"\n"), 0o600))
	cfg, _ := json.Marshal(map[string]any{
		"tuple": rr.Tuple, "lease_not_after": time.Now().Add(time.Hour).UTC(), "principal": rr.Tuple.Owner,
		"receiver":  map[string]any{"kind": "unix", "path": rr.Sock, "host_only": true},
		"state_dir": filepath.Join(dir, "state"), "audit_key_file": keyPath,
	})
	realrecv.Must(t, os.WriteFile(cfgPath, cfg, 0o600))

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := make(chan int, 1)
	go func() {
		defer outW.Close()
		code <- cmdRun(ctx, []string{"--config", cfgPath, "--no-jail", "--", "test-agent"}, inR, outW, &stderr)
	}()
	updates := make(chan string)
	go func() {
		defer close(updates)
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			updates <- sc.Text()
		}
	}()
	waitWrite := func(name string) {
		t.Helper()
		for {
			select {
			case u, ok := <-updates:
				if !ok {
					t.Fatalf("run ended before %s was written (stderr: %s)", name, stderr.String())
				}
				if strings.Contains(u, "ok write") {
					if _, err := os.Stat(filepath.Join(rr.Tuple.Root, name)); err != nil {
						t.Fatalf("the agent reported the write, the file is not there: %v", err)
					}
					return
				}
			case <-ctx.Done():
				t.Fatalf("no write of %s while stdin stayed open: the prompt was not sent as its line arrived", name)
			}
		}
	}
	io.WriteString(inW, "write ROOT/line-1.txt one\n")
	waitWrite("line-1.txt")
	io.WriteString(inW, "\nwrite ROOT/line-2.txt two\n")
	waitWrite("line-2.txt")
	inW.Close()
	for range updates { // drain until run closes stdout
	}
	if c := <-code; c != exitOK {
		t.Fatalf("run exit %d after stdin closed, want 0 (stderr: %s)", c, stderr.String())
	}
}

// syncBuffer is a strings.Builder safe to read while run writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLineReader: blank lines are skipped, a cancelled wait returns at
// once with ctx's error, and an over-long line is an error, not a prompt.
func TestLineReader(t *testing.T) {
	inR, inW := io.Pipe()
	lr := readLines(inR)
	defer lr.stop()
	go io.WriteString(inW, "\n  \nfirst\n")
	if l, ok, err := lr.next(context.Background()); l != "first" || !ok || err != nil {
		t.Fatalf("next = %q %v %v", l, ok, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok, err := lr.next(ctx); ok || err != context.Canceled {
		t.Fatalf("cancelled wait: %v %v", ok, err)
	}
	go func() { io.WriteString(inW, strings.Repeat("x", 2<<20)+"\n"); inW.Close() }()
	if l, ok, err := lr.next(context.Background()); ok || err == nil {
		t.Fatalf("over-long line: %d bytes, %v %v; want an error", len(l), ok, err)
	}
	inR.Close() // unblocks the writer of the rest of the long line
}
