package host_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/plugin/host"
)

// hostHelperArg makes the test binary a host that loads the helper plugin,
// prints the plugin's pid and waits to be killed.
const hostHelperArg = "tether-host-helper"

func hostHelper() int {
	path, err := os.Executable()
	if err != nil {
		return 1
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := host.Load(ctx, path, sha256Hex(b), host.WithArgs(helperArg)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kids := childrenOf(os.Getpid())
	if len(kids) != 1 {
		fmt.Fprintf(os.Stderr, "plugin children: %v\n", kids)
		return 1
	}
	fmt.Println(kids[0])
	select {} // until killed
}

// TestPluginExitsWhenItsHostIsKilled: a host killed with SIGKILL cannot
// close its plugin; the plugin notices it was orphaned and exits rather
// than serving nobody forever.
func TestPluginExitsWhenItsHostIsKilled(t *testing.T) {
	cmd := exec.Command(os.Args[0], hostHelperArg)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("host helper: %q %v %v", line, err, perr)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(20 * time.Second) // a bound for a loaded machine: the plugin polls every second
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin %d still runs 20 s after its host was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie awaiting its new parent counts
// as gone).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	return !strings.HasPrefix(rest, "Z")
}

// childrenOf returns the pids whose parent is ppid.
func childrenOf(ppid int) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
