package host_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// children returns the pids of this process's children running helperArg.
func pluginChildren(t *testing.T) []int {
	t.Helper()
	var pids []int
	entries, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, e := range entries {
		b, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := b[bytes.LastIndexByte(b, ')')+2:]
		f := strings.Fields(string(rest))
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		dir := filepath.Dir(e)
		cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		if args := strings.Split(string(cmd), "\x00"); len(args) > 1 && args[1] == helperArg {
			pid, _ := strconv.Atoi(filepath.Base(dir))
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestPluginGetsNoHostEnvironmentAndNoStdin: the host's environment (which
// may hold credentials) does not reach the plugin, and the plugin's stdin
// is /dev/null, not the host's ACP stream.
func TestPluginGetsNoHostEnvironmentAndNoStdin(t *testing.T) {
	t.Setenv("TETHER_TEST_CANARY", "host-secret")
	stdinR, stdinW, err := os.Pipe() // stands for the host's ACP stdin
	if err != nil {
		t.Fatal(err)
	}
	defer stdinW.Close()
	saved := os.Stdin
	os.Stdin = stdinR
	p := loadPlugin(t)
	os.Stdin = saved
	defer p.Close()
	pids := pluginChildren(t)
	if len(pids) != 1 {
		t.Fatalf("found %d plugin children", len(pids))
	}
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pids[0]), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(env, []byte("host-secret")) || bytes.Contains(env, []byte("PATH=")) {
		t.Fatalf("plugin environment leaks the host's: %q", env)
	}
	if fd0, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pids[0]), "fd", "0")); err != nil || fd0 != "/dev/null" {
		t.Fatalf("plugin stdin is %q (%v), want /dev/null", fd0, err)
	}
}
