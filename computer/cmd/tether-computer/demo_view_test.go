package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestIntegrationDemoView is `make demo-view` on the product path: the
// embedded daemon creates a VM computer with a screen, prints a control
// and a view-only link on loopback, and waits; Ctrl-C (SIGINT, as the
// README ends it) ends the wait but not the daemon: the demo deletes the
// computer, verifies the view's audit log kept with its records (the two
// mints), and removes its directory.
func TestIntegrationDemoView(t *testing.T) {
	testenv.Require(t, "root", "qemu")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := bins.Build(ctx, bins.Receiver, bins.Computer, bins.VMGuest)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := interruptWhenWaiting(ctx, exec.CommandContext(ctx, b.Path(bins.Computer), "demo-view", "--bin", b.Dir))
	if err != nil {
		t.Fatalf("tether-computer demo-view: %v\n%s", err, out)
	}
	t.Logf("the demo took %v", time.Since(start).Round(time.Millisecond))
	for _, re := range []string{
		`(?m)^  control:   http://127\.0\.0\.1:\d+/#t=\S+$`,
		`(?m)^  view only: http://127\.0\.0\.1:\d+/#t=\S+$`,
		`(?m)^Open a link in a browser on this machine\. Mint another with:\n  tether-computer link --socket /\S+/api\.sock --role view c-[0-9a-f]+$`,
		`audit log, kept with the records: 2 entries map\[token_mint:2\], head [0-9a-f]+: the hash chain holds`,
	} {
		if !regexp.MustCompile(re).Match(out) {
			t.Errorf("the demo's output lacks %s:\n%s", re, out)
		}
	}
	m := regexp.MustCompile(`API socket (\S+)\)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("the demo names no socket:\n%s", out)
	}
	if _, err := os.Stat(filepath.Dir(string(m[1]))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the demo's directory %s is left: %v", filepath.Dir(string(m[1])), err)
	}
	if bytes.Contains(out, []byte("FAILED")) {
		t.Errorf("the demo failed:\n%s", out)
	}
}

// interruptWhenWaiting runs cmd, sends it SIGINT once it prints that
// Ctrl-C ends the demo, and returns all it printed once it exits.
func interruptWhenWaiting(ctx context.Context, cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		out.Write(append(sc.Bytes(), '\n'))
		if sc.Text() == "Ctrl-C ends the demo." {
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				return out.Bytes(), err
			}
		}
	}
	select {
	case err := <-exited:
		return out.Bytes(), err
	case <-ctx.Done():
		return out.Bytes(), ctx.Err()
	}
}
