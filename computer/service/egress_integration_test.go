package service

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
)

// refusingEgress is a stand-in for the host's proxy that refuses every
// request: it reads the request line, reports a refusal naming the
// requested host, answers 403 and closes. It fails the test on Attach of
// an id twice.
type refusingEgress struct {
	t  *testing.T
	mu sync.Mutex
	ln map[string]net.Listener
	wg sync.WaitGroup
}

func (e *refusingEgress) Attach(ctx context.Context, id string, pol policy.Policy, ln net.Listener, refused func(policy.Refusal)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln[id] != nil {
		e.t.Errorf("Attach %s twice", id)
	}
	e.ln[id] = ln
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(conn).ReadString('\n')
			host := "?"
			if f := strings.Fields(line); len(f) == 3 {
				host = strings.TrimPrefix(f[1], "http://")
				host, _, _ = strings.Cut(host, "/")
			}
			refused(policy.Refusal{Time: time.Now(), Host: host, Port: 80, Check: policy.CheckPolicy,
				Reason: "no allow rule matches"})
			conn.Write([]byte("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			conn.Close()
		}
	}()
	return nil
}

func (e *refusingEgress) SetPolicy(ctx context.Context, id string, pol policy.Policy) error {
	return nil
}

func (e *refusingEgress) Detach(ctx context.Context, id string) error {
	e.mu.Lock()
	ln := e.ln[id]
	delete(e.ln, id)
	e.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	return nil
}

// TestIntegrationEgressInRealComputer: over the real provisioner, a
// computer made by a service with egress finds the proxy through its
// environment (curl, with no setup, reaches the stand-in proxy in the
// computer's own namespace and gets its 403), and the refusal shows in
// the computer's refusal log; after delete the listener is closed.
func TestIntegrationEgressInRealComputer(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	set, err := bins.Build(ctx, bins.Receiver)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	eg := &refusingEgress{t: t, ln: map[string]net.Listener{}}
	s := openReal(t, Config{Dir: dir, Provisioner: provision.NewProvisioner(provision.Config{Bins: set}), Egress: eg})
	c, err := s.Create(ctx, alice, api.CreateRequest{Limits: api.Limits{DiskBytes: 64 << 20},
		Egress: policy.Policy{Allow: []policy.Rule{{Host: "pypi.org"}}}})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	m := s.computers[c.ID].m.(*provision.Machine)
	s.mu.Unlock()
	out := runInMachine(ctx, t, m, "curl -s -o /dev/null -w 'HTTP %{http_code}\\n' http://pypi.org/simple/; "+
		"for i in $(seq 200); do grep -qF '\"pypi.org:80\"' "+provision.RefusalLog+" 2>/dev/null && break; sleep 0.05; done; cat "+
		provision.RefusalLog)
	if !strings.Contains(out, "HTTP 403\n") || !strings.Contains(out, `refused "pypi.org:80" check="policy"`) {
		t.Fatalf("in the computer:\n%s\nwant curl to reach the proxy (403) and the refusal in %s", out, provision.RefusalLog)
	}
	info, err := s.Egress(ctx, alice, c.ID)
	if err != nil || !info.Attached || info.RefusalLog != provision.RefusalLog {
		t.Fatalf("Egress = %+v, %v", info, err)
	}
	eg.mu.Lock()
	ln := eg.ln[c.ID]
	eg.mu.Unlock()
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	eg.wg.Wait() // the accept loop ends once Detach closed the listener
	if _, err := ln.Accept(); err == nil {
		t.Fatal("the listener still accepts after delete")
	}
}

// runInMachine runs a shell script in m as the custodian would and
// returns its output once it exits.
func runInMachine(ctx context.Context, t *testing.T, m *provision.Machine, script string) string {
	t.Helper()
	wc, err := provision.WireClient(ctx, m.Local())
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	tuple, deadline := m.Tuple().SHA256(), time.Now().Add(time.Minute)
	key := func() string {
		b := make([]byte, 8)
		rand.Read(b)
		return "egress-" + hex.EncodeToString(b)
	}
	var res wire.ExecStartResult
	if err := wc.Call(ctx, wire.OpExecStart, tuple, key(), deadline,
		wire.ExecStartArgs{Argv: []string{"/bin/bash", "-c", script}, Env: map[string]string{"PATH": "/usr/bin:/bin"}}, &res); err != nil {
		t.Fatalf("exec_start: %v", err)
	}
	var w wire.ExecWaitResult
	if err := wc.Call(ctx, wire.OpExecWait, tuple, key(), deadline, wire.TerminalArgs{TerminalID: res.TerminalID}, &w); err != nil {
		t.Fatalf("exec_wait: %v", err)
	}
	var o wire.ExecOutputResult
	if err := wc.Call(ctx, wire.OpExecOutput, tuple, key(), deadline, wire.TerminalArgs{TerminalID: res.TerminalID}, &o); err != nil {
		t.Fatalf("exec_output: %v", err)
	}
	return o.Output
}
