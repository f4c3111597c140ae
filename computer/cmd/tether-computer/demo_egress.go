package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/egresslog"
	"github.com/tetherdev/tether/egress/labnet"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/receiver/wire"
)

// The demo's small internet: two names at one web server, and the
// operator preset that lifts its private range (the proxy refuses
// private addresses otherwise). A computer's policy allows one name.
const (
	demoAllowed = "allowed.lab.test"
	demoDenied  = "denied.lab.test"
	demoPreset  = "lab"
)

// demoEgress is the lab network and the egress proxy the demo's service
// gives its computers. Close closes both.
type demoEgress struct {
	lab     *labnet.Net
	proxy   *egress.Proxy
	logPath string
}

// startDemoEgress starts the lab network (a namespace on a veth pair,
// its DNS answering the two names, a web server) and a proxy whose DNS
// is the lab's and whose one preset lifts the lab's range; the egress
// log is in dir.
func startDemoEgress(ctx context.Context, dir string) (*demoEgress, error) {
	lab, err := labnet.New(ctx, labnet.Options{Ports: []int{80}})
	if err != nil {
		return nil, fmt.Errorf("lab network: %w", err)
	}
	lab.Zone.Set(demoAllowed, 60, lab.Addr)
	lab.Zone.Set(demoDenied, 60, lab.Addr)
	page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s, a web server in the demo's lab network\n", r.Host)
	})
	if err := lab.ServeHTTP(80, page); err != nil {
		lab.Close()
		return nil, err
	}
	e := &demoEgress{lab: lab, logPath: filepath.Join(dir, "egress.log")}
	e.proxy, err = egress.New(egress.Config{
		Presets: []policy.Preset{{Name: demoPreset, AllowCIDRs: []string{lab.Prefix.String()}}},
		DNS:     lab.DNSAddr.String(),
		LogPath: e.logPath,
	})
	if err != nil {
		lab.Close()
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	return e, nil
}

// Close closes the proxy, then the lab network.
func (e *demoEgress) Close() error { return errors.Join(e.proxy.Close(), e.lab.Close()) }

// egress makes a computer whose policy allows demoAllowed, fetches it
// and demoDenied with curl inside the computer, shows the refusal as the
// computer sees it, and checks the egress log.
func (s *demoSteps) egress(ctx context.Context) error {
	pol := policy.Policy{Presets: []string{demoPreset}, Allow: []policy.Rule{{Host: demoAllowed}}}
	c, err := s.cl.Create(ctx, api.CreateRequest{LeaseTTLSeconds: 300, Egress: pol})
	if err != nil {
		return err
	}
	s.say("lab network %s (its own namespace; DNS and a web server at %s), proxy preset %q lifts that range",
		s.eg.lab.Prefix, s.eg.lab.Addr, demoPreset)
	s.say("%s made with the policy: allow %s (ports 80, 443); everything else is denied", c.ID, demoAllowed)
	rc, err := dialCustodian(ctx, c.CustodianConfig)
	if err != nil {
		return err
	}
	defer rc.Close()
	out, err := rc.run(ctx, "curl -sS --fail --max-time 10 http://"+demoAllowed+"/")
	if err != nil {
		return fmt.Errorf("allowed fetch: %w", err)
	}
	s.say("$ curl http://%s/   (inside the computer; the grant's environment names the proxy)", demoAllowed)
	s.say("  %s", strings.TrimSpace(out))
	if err := s.refused(ctx, rc); err != nil {
		return err
	}
	head, err := egresslog.Verify(s.eg.logPath)
	if err != nil {
		return fmt.Errorf("egress log: %w", err)
	}
	s.say("egress log: %d connections, hash chain verifies (head %s...)", head.Records, head.Hash[:12])
	return s.cl.Delete(ctx, c.ID)
}

// refused fetches demoDenied and shows the proxy's answer and the line
// the refusal left in the computer's refusals file.
func (s *demoSteps) refused(ctx context.Context, rc *receiverConn) error {
	out, err := rc.run(ctx, "curl -sS --max-time 10 -o /dev/null -D - http://"+demoDenied+"/ | head -1")
	if err != nil {
		return fmt.Errorf("refused fetch: %w", err)
	}
	status := strings.TrimSpace(out)
	if !strings.HasPrefix(status, "HTTP/1.1 403 ") {
		return fmt.Errorf("refused fetch: got %q, want the proxy's 403", status)
	}
	s.say("$ curl http://%s/", demoDenied)
	s.say("  %s", status)
	// The refusal reaches the file a moment after the 403: wait for it.
	line, err := rc.run(ctx, fmt.Sprintf("for i in $(seq 100); do grep -F %s %s && exit; sleep 0.05; done; exit 1",
		`'"`+demoDenied+`:80"'`, provision.RefusalLog))
	if err != nil {
		return fmt.Errorf("refusal in %s: %w", provision.RefusalLog, err)
	}
	s.say("$ cat %s", provision.RefusalLog)
	s.say("  %s", strings.TrimSpace(line))
	return nil
}

// receiverConn is a connection to a computer's receiver, dialed as a
// custodian dials it: from the configuration file the service wrote.
type receiverConn struct {
	conn  custodian.ReceiverConn
	tuple string
}

// dialCustodian dials the receiver named in the custodian configuration
// at path; the caller closes the connection.
func dialCustodian(ctx context.Context, path string) (*receiverConn, error) {
	cfg, err := custodian.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	dial, err := custodian.ReceiverDialer(cfg.Receiver)
	if err != nil {
		return nil, err
	}
	conn, err := dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial the receiver: %w", err)
	}
	return &receiverConn{conn: conn, tuple: cfg.Tuple.SHA256()}, nil
}

// Close closes the connection.
func (r *receiverConn) Close() error { return r.conn.Close() }

func (r *receiverConn) call(ctx context.Context, op wire.Op, args, res any) error {
	b := make([]byte, 8)
	rand.Read(b)
	return r.conn.CallFenced(ctx, op, r.tuple, "demo-"+hex.EncodeToString(b), 0, time.Now().Add(time.Minute), args, res)
}

// run runs a bash script in the computer with the grant's environment
// and returns its output; a non-zero exit is an error.
func (r *receiverConn) run(ctx context.Context, script string) (string, error) {
	var st wire.ExecStartResult
	if err := r.call(ctx, wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/bash", "-c", script},
		Env: map[string]string{"PATH": "/usr/bin:/bin"}}, &st); err != nil {
		return "", fmt.Errorf("exec_start: %w", err)
	}
	var w wire.ExecWaitResult
	if err := r.call(ctx, wire.OpExecWait, wire.TerminalArgs{TerminalID: st.TerminalID, Release: true}, &w); err != nil {
		return "", fmt.Errorf("exec_wait: %w", err)
	}
	var out string
	if w.Output != nil {
		out = *w.Output
	}
	if w.Exit.ExitCode == nil || *w.Exit.ExitCode != 0 {
		return out, fmt.Errorf("%q ended %+v: %s", script, w.Exit, out)
	}
	return out, nil
}
