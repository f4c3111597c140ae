package host_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/plugin/contract"
	"github.com/tetherdev/tether/plugin/host"
)

// TestIntegrationReadTextFileThroughPlugin is the vertical slice: a real
// plugin process (this test binary), the real host library, a real ACP
// connection whose client checks the op tag on every callback.
func TestIntegrationReadTextFileThroughPlugin(t *testing.T) {
	p := loadPlugin(t)
	lease := time.Now().Add(time.Hour)
	client := newClient(t, lease)
	l := newLink(t, p, client, "alice")
	if err := os.WriteFile(filepath.Join(client.Root, "hello.txt"), []byte("hello, computer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tu := tuple("alice", client.Root)
	ctx := ctxT(t)
	st, err := l.conn.OpenSession(ctx, host.MethodNew, "s1", bindMeta(t, tu, lease))
	if err != nil {
		t.Fatalf("bind: %v", err)
	}
	if st.State != host.Bound || st.TupleSHA256 != tu.SHA256() || st.GrantGeneration != 7 {
		t.Fatalf("status after bind = %v", st)
	}
	resp, err := l.conn.ReadTextFile(ctx, "s1", host.CallOptions{}, "hello.txt", 0, 0)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if resp.Content != "hello, computer\n" || resp.Path != filepath.Join(client.Root, "hello.txt") {
		t.Fatalf("read = %q at %q", resp.Content, resp.Path)
	}
	reads := callsOf(client, "fs/read_text_file")
	if len(reads) != 1 {
		t.Fatalf("client saw %d reads, want 1", len(reads))
	}
	op := reads[0].Op
	if reads[0].OpErr != nil || op.TupleSHA256 != tu.SHA256() || !strings.HasPrefix(op.OpKey, resp.OpKey+":") ||
		!op.Deadline.After(time.Now()) || op.Deadline.After(time.Now().Add(61*time.Second)) {
		t.Fatalf("op meta = %+v (err %v), op key %q", op, reads[0].OpErr, resp.OpKey)
	}
	if n := len(callsOf(client, acpmeta.MethodAttach)); n != 1 {
		t.Fatalf("attach calls = %d, want 1", n)
	}
}

func TestLoadRefusesWrongChecksum(t *testing.T) {
	path, sum := selfBinary(t)
	bad := strings.Repeat("0", 64)
	_, err := host.Load(context.Background(), path, bad, host.WithArgs(helperArg))
	var ce *host.ChecksumError
	if !errors.Is(err, host.ErrChecksum) || !errors.As(err, &ce) || ce.Got != sum || ce.Want != bad {
		t.Fatalf("Load with wrong sum: %v", err)
	}
	if _, err := host.Load(context.Background(), path, "xyz"); !errors.Is(err, host.ErrChecksum) {
		t.Fatalf("Load with malformed sum: %v", err)
	}
}

// TestLoadRunsTheBytesItHashed replaces the file after Load verified it:
// the plugin that runs is still the verified copy (sealed memfd), so a
// swap between check and exec cannot smuggle in other code.
func TestLoadRunsTheBytesItHashed(t *testing.T) {
	path, sum := selfBinary(t)
	dir := t.TempDir()
	copyPath := filepath.Join(dir, "tether-plugin")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyPath, b, 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := host.Load(ctxT(t), copyPath, sum, host.WithArgs(helperArg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := os.WriteFile(copyPath, []byte("#!/bin/sh\necho pwned\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The running plugin still answers the real protocol.
	l := newLink(t, p, newClient(t, time.Now().Add(time.Hour)), "alice")
	if _, err := l.conn.OpenSession(ctxT(t), host.MethodNew, "s1", nil); err != nil {
		t.Fatalf("plugin no longer serves: %v", err)
	}
	// And the swapped file is refused by the next Load.
	if _, err := host.Load(ctxT(t), copyPath, sum); !errors.Is(err, host.ErrChecksum) {
		t.Fatalf("swapped binary loaded: %v", err)
	}
}

func TestLoadVersionMismatchNamesBothSides(t *testing.T) {
	path, sum := selfBinary(t)
	_, err := host.Load(ctxT(t), path, sum, host.WithArgs(helperArg, "versions=1,2"))
	if !errors.Is(err, host.ErrStart) {
		t.Fatalf("Load against a v1/v2 plugin: %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"speaks protocol versions [1 2]", "host speaks [3]", "the host speaks protocol versions [3]"} {
		if !strings.Contains(msg, want) {
			t.Errorf("mismatch error %q does not say %q", msg, want)
		}
	}
}

// TestPluginRunByHandExplainsAndFails runs the real command's code path
// by hand: bare, with a stray argument, and asking for help with the
// handshake environment a host sets. Each explains itself on stderr,
// prints nothing on stdout (go-plugin's handshake channel) and exits 2.
func TestPluginRunByHandExplainsAndFails(t *testing.T) {
	path, _ := selfBinary(t)
	cookie := contract.Handshake.MagicCookieKey + "=" + contract.Handshake.MagicCookieValue
	for _, c := range []struct {
		args []string
		env  []string
	}{
		{nil, nil}, {[]string{"stray"}, nil}, {[]string{"--bogus"}, nil},
		{[]string{"--help"}, []string{cookie}}, {[]string{"-h"}, []string{cookie}}, {[]string{"stray"}, []string{cookie}},
	} {
		stdout, stderr, code := runPlugin(t, path, c.args, c.env)
		if code != 2 {
			t.Fatalf("tether-plugin %v (env %v): exit %d, want 2", c.args, c.env, code)
		}
		if c.args == nil || c.env != nil {
			if !strings.Contains(stderr, "not meant to be run by hand") || !strings.Contains(stderr, "plugin/host.Load") {
				t.Fatalf("tether-plugin %v printed %q on stderr", c.args, stderr)
			}
		} else if stderr == "" {
			t.Fatalf("tether-plugin %v printed nothing on stderr", c.args)
		}
		if stdout != "" {
			t.Fatalf("tether-plugin %v printed %q on stdout", c.args, stdout)
		}
	}
}

// TestPluginHelpByHand: asked for help without go-plugin's cookie (run by
// hand, not by a host), the plugin prints its usage on stdout and exits 0,
// like every tether binary (admission/cli).
func TestPluginHelpByHand(t *testing.T) {
	path, _ := selfBinary(t)
	for _, h := range []string{"--help", "-h", "-help"} {
		stdout, stderr, code := runPlugin(t, path, []string{h}, nil)
		if code != 0 || stderr != "" {
			t.Fatalf("tether-plugin %s: exit %d, stderr %q; want 0 and nothing", h, code, stderr)
		}
		if !strings.Contains(stdout, "not meant to be run by hand") || strings.Count(stdout, "Usage: tether-plugin") != 1 {
			t.Fatalf("tether-plugin %s printed %q on stdout", h, stdout)
		}
	}
}

// runPlugin runs the plugin's helper binary with args and only env.
func runPlugin(t *testing.T, path string, args, env []string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(path, append([]string{helperArg}, args...)...)
	cmd.Env = append([]string{}, env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("tether-plugin %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// TestPluginRefusesWithoutMutualTLS: a host that does not enable AutoMTLS
// gets no plugin.
func TestPluginRefusesWithoutMutualTLS(t *testing.T) {
	path, _ := selfBinary(t)
	cmd := exec.Command(path, helperArg)
	cmd.Env = []string{"TETHER_PLUGIN_COOKIE=c0a1d2b7-tether-plugin-v1-5f0e9c4a",
		fmt.Sprintf("PLUGIN_PROTOCOL_VERSIONS=%d", contract.ProtocolVersions[0])}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), "mutual TLS") {
		t.Fatalf("no-mTLS start: err=%v out=%q", err, out)
	}
}

// TestPluginProcsFlag: --procs is checked before the plugin serves, and a
// plugin started with another value still serves.
func TestPluginProcsFlag(t *testing.T) {
	path, sum := selfBinary(t)
	cmd := exec.Command(path, helperArg, "--procs", "0")
	cmd.Env = []string{"TETHER_PLUGIN_COOKIE=c0a1d2b7-tether-plugin-v1-5f0e9c4a"}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--procs must be at least 1") {
		t.Fatalf("--procs 0: err=%v out=%q", err, out)
	}
	p, err := host.Load(ctxT(t), path, sum, host.WithArgs(helperArg, "--procs", "2"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	l, _ := bound(t, p)
	readOK(t, l, "s1")
}
