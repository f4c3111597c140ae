package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/pki"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// lockedLog is the daemon's stderr, safe to read while it runs.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startLogged runs the daemon as env.start does, its stderr in a lockedLog.
func (e *env) startLogged() *lockedLog {
	e.t.Helper()
	log := &lockedLog{}
	cmd := exec.Command(binary(e.t), "--config", e.config)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	e.t.Cleanup(func() { cmd.Process.Kill(); <-done })
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if conn, err := e.dial(context.Background()); err == nil {
			conn.Close()
			return log
		}
		select {
		case err := <-done:
			e.t.Fatalf("daemon exited: %v\n%s", err, log)
		case <-time.After(10 * time.Millisecond):
		}
	}
	e.t.Fatalf("daemon did not listen within 15 s\n%s", log)
	return nil
}

// tlsDaemon starts the daemon serving mutual TLS on a loopback port and
// returns its address and its log.
func tlsDaemon(t *testing.T) (*env, *lockedLog, string) {
	t.Helper()
	e := newEnv(t, "off", "thread")
	ca, err := pki.NewCA("tether test CA")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Server("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(e.base, "ca.pem")
	if err := ca.WriteCert(caFile); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := srv.WriteFiles(e.base, "receiver")
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	e.cfg["listen"] = []any{map[string]any{"kind": "tls", "address": addr, "ca_file": caFile,
		"cert_file": certFile, "key_file": keyFile}}
	e.writeConfig()
	e.dial = tlsDialer(t, ca, addr)
	return e, e.startLogged(), addr
}

// attachWithin dials and attaches as a custodian's receiver link does,
// redialling after a refused connection, until bound.
func attachWithin(t *testing.T, e *env, bound time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		last = attachOnce(ctx, e)
		if last == nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("no attach within %s: %v", bound, last)
}

func attachOnce(ctx context.Context, e *env) error {
	conn, err := e.dial(ctx)
	if err != nil {
		return err
	}
	c, err := wireclient.NewClient(conn, wireclient.ClientConfig{})
	if err != nil {
		conn.Close()
		return err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	var res wire.AttachResult
	return c.Call(ctx, wire.OpAttach, e.grant.Tuple.SHA256(), "attach-1", dl, &wire.AttachArgs{}, &res)
}

// TestIntegrationIdleConnectionsDoNotStarveAttach: a process holding 300
// idle TCP connections to the receiver's port (a command of the computer
// could) does not stop a custodian from attaching, and its connections
// are dropped once they have sent no ClientHello for a second.
func TestIntegrationIdleConnectionsDoNotStarveAttach(t *testing.T) {
	testenv.Require(t, "root")
	e, _, addr := tlsDaemon(t)
	idle := make([]net.Conn, 300)
	for i := range idle {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle[i] = c
	}
	attachWithin(t, e, 5*time.Second) // before: 32 slots of 10 s each, about 90 s
	for i, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, c); isTimeout(err) {
			t.Fatalf("idle connection %d still open 5 s after the flood", i)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestIntegrationGarbageFloodLogBounded: 3,000 connections that send
// garbage instead of a handshake grow the daemon's log by a bounded
// amount (aggregated refusals), and the receiver still serves.
func TestIntegrationGarbageFloodLogBounded(t *testing.T) {
	testenv.Require(t, "root")
	e, log, addr := tlsDaemon(t)
	before := log.Len()
	for range 3000 {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			continue // refused at once over a limit: also fine
		}
		c.Write(bytes.Repeat([]byte("GARBAGE "), 64))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, c)
		c.Close()
	}
	attachWithin(t, e, 5*time.Second)
	if grown := log.Len() - before; grown > 8<<10 {
		t.Fatalf("3000 garbage connections grew the log by %d bytes, want at most 8 KiB:\n%.3000s", grown, log)
	}
}

// TestIntegrationOrphanKilledWhenCustodianDies: the custodian's connection
// ends with a command running (as when it is SIGKILLed) and nothing
// reattaches: the daemon kills the command after orphan_grace_s, long
// before its deadline.
func TestIntegrationOrphanKilledWhenCustodianDies(t *testing.T) {
	testenv.Require(t, "root")
	e := newEnv(t, "off", "thread")
	e.cfg["limits"] = map[string]any{"orphan_grace_s": 1}
	e.writeConfig()
	e.start()
	c := e.client()
	var st wire.ExecStartResult
	if err := c.call(wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/sleep", "600"}}, &st); err != nil {
		t.Fatal(err)
	}
	c.c.Close() // the custodian is gone
	deadline := time.Now().Add(15 * time.Second)
	for slices.Contains(liveProcsOfUID(t, gUID), st.PID) {
		if time.Now().After(deadline) {
			t.Fatalf("command %d still runs 15 s after the custodian's connection ended", st.PID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
