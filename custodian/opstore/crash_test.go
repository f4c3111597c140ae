package opstore

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "OPSTORE_CRASH_HELPER"

func TestMain(m *testing.M) {
	if step := os.Getenv(helperEnv); step != "" {
		crashHelper(step)
		return
	}
	if mode := os.Getenv(etcdHelperEnv); mode != "" {
		etcdHelper(mode)
		return
	}
	os.Exit(m.Run())
}

// crashHelper is the child of TestIntegrationCrash: it runs up to one
// step, says "ready" and waits to be SIGKILLed.
func crashHelper(step string) {
	fail := func(err error) { os.Stderr.WriteString(err.Error() + "\n"); os.Exit(3) }
	s, err := Open(os.Getenv("OPSTORE_DIR"), Options{})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	tk, _, err := s.Begin(ctx, intent("k", "req"))
	if err != nil {
		fail(err)
	}
	switch step {
	case "finished", "flushed":
		err = tk.Finish(&Receipt{Outcome: Verified, Response: json.RawMessage(`{"ok":true}`)})
	case "pending":
		err = tk.Finish(&Receipt{Outcome: Pending, Response: json.RawMessage(`{"terminalId":"t9"}`), TerminalID: "t9"})
	}
	if err == nil && step != "begun" && step != "finished" {
		err = s.Flush(ctx)
	}
	if err != nil {
		fail(err)
	}
	os.Stdout.WriteString("ready\n")
	time.Sleep(time.Minute)
	os.Exit(4)
}

// TestIntegrationCrash SIGKILLs a real process holding the store at each
// step and checks that the key is never handed out for dispatch again.
func TestIntegrationCrash(t *testing.T) {
	for _, step := range []string{"begun", "finished", "flushed", "pending"} {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			killAt(t, dir, step)
			s := openT(t, dir, Options{})
			tk, r, err := s.Begin(context.Background(), intent("k", "req"))
			if tk != nil || err != nil || r == nil {
				t.Fatalf("after SIGKILL at %s: Begin = ticket %v, err %v; want a replay and no dispatch", step, tk, err)
			}
			switch step {
			case "begun":
				if r.Outcome != Interrupted || r.Error == nil || r.Error.Code != CodeInterrupted {
					t.Fatalf("dispatched-without-result = %+v, want interrupted", r)
				}
			case "finished":
				if r.Outcome != Interrupted && r.Outcome != Verified {
					t.Fatalf("finished-before-commit = %s, want verified or interrupted", r.Outcome)
				}
			case "flushed":
				if r.Outcome != Verified || string(r.Response) != `{"ok":true}` {
					t.Fatalf("committed result = %+v, want the stored receipt", r)
				}
			case "pending":
				if r.Outcome != Interrupted || string(r.Response) != `{"terminalId":"t9"}` {
					t.Fatalf("pending exec = %+v, want interrupted with its response kept", r)
				}
			}
			if _, _, err := s.Begin(context.Background(), intent("k", "other")); err == nil {
				t.Fatal("a different digest for the recovered key was accepted")
			}
		})
	}
}

func killAt(t *testing.T, dir, step string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+step, "OPSTORE_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper did not reach step %s: %q %v", step, line, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
}
