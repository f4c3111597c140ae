package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeRefusesASocketAnotherServes: a second `serve` on a socket a
// running daemon answers on (the README's blocks run in order start one
// with the defaults, then another) exits non-zero naming the socket and
// opens nothing; the first keeps its socket file and still accepts.
// Positive control: a stale socket file, which nothing answers on, is
// not refused (serve replaces it, as it always did).
func TestServeRefusesASocketAnotherServes(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	before, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"serve", "--dir", state, "--socket", sock, "--pool", "0"}, &stdout, &stderr)
	if code == exitOK || !strings.Contains(stderr.String(), ErrSocketServed.Error()) || !strings.Contains(stderr.String(), sock) {
		t.Fatalf("serve on a served socket: exit %d, stderr %q; want a failure naming the socket", code, stderr.String())
	}
	if _, err := os.Lstat(state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused serve made its state directory: %v", err)
	}
	after, err := os.Lstat(sock)
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the first daemon's socket file was replaced or removed: %v", err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("the first listener no longer answers: %v", err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}

	// Control: a stale socket file (its listener gone, the file left).
	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	sl.SetUnlinkOnClose(false)
	sl.Close()
	if fi, err := os.Lstat(stale); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("stale socket file: %v %v", fi, err)
	}
	if err := socketUnserved(stale); err != nil {
		t.Errorf("a stale socket file was refused: %v", err)
	}
	if err := socketUnserved(filepath.Join(dir, "none.sock")); err != nil {
		t.Errorf("a missing socket was refused: %v", err)
	}
}
