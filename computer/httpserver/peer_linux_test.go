package httpserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// envPeerHelper makes the test binary a unix-socket client: it GETs
// /v1/computers over the socket the variable names, prints the status
// (or "error: ...") and exits.
const envPeerHelper = "TETHER_TEST_PEER_HELPER"

func TestMain(m *testing.M) {
	if sock := os.Getenv(envPeerHelper); sock != "" {
		fmt.Println(peerHelper(sock))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// peerHelper is the child's request.
func peerHelper(sock string) string {
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	resp, err := hc.Get("http://tether-computer/v1/computers")
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

// Unprivileged ids of the test: a stranger, and a member whose primary
// group is the admitted group.
const (
	strangerUID = 60001
	memberUID   = 60003
	groupGID    = 60002
)

// TestUnixSocketPeerCredentials: on the unix socket a peer that is
// neither root nor in the configured group is refused when it connects
// (the connection is closed before any request, and audited with its
// uid), even with the socket file opened to everyone (0666) so the file
// system does not stop it first. Positive controls: a member of the
// group is admitted as owner uid:N, and root as admin.
func TestUnixSocketPeerCredentials(t *testing.T) {
	testenv.Require(t, "root")
	h := newHarness(t)
	dir := shareableDir(t)
	sock := filepath.Join(dir, "api.sock")
	refused := make(chan AuditRecord, 4)
	gid := uint32(groupGID)
	l, err := ListenUnix(sock, PeerPolicy{Group: &gid}, func(r AuditRecord) { refused <- r })
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(sock); st.Mode().Perm() != 0o660 || st.Sys().(*syscall.Stat_t).Gid != groupGID {
		t.Errorf("socket mode %v gid %d, want 0660 and the group", st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Gid)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	bin := copyTestBinary(t, dir)

	out := runPeerChild(t, bin, sock, strangerUID, strangerUID)
	if !strings.HasPrefix(out, "error:") {
		t.Errorf("a stranger (uid %d) got an answer: %q", strangerUID, out)
	}
	select {
	case r := <-refused:
		if r.Action != AuditPeerRefused || !strings.Contains(r.Who, fmt.Sprintf("uid:%d", strangerUID)) || r.Time.IsZero() {
			t.Errorf("audit record %+v: want peer_refused naming uid %d", r, strangerUID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the refusal was not audited")
	}

	// Control off: the same stranger through a plain unix listener (no
	// peer check) reaches the HTTP layer, which asks it for a token.
	plain := filepath.Join(dir, "plain.sock")
	pl, err := net.Listen("unix", plain)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(plain, 0o666); err != nil {
		t.Fatal(err)
	}
	plainDone := make(chan error, 1)
	go func() { plainDone <- h.srv.Serve(ctx, pl) }()
	defer func() { cancel(); <-plainDone }()
	if out := runPeerChild(t, bin, plain, strangerUID, strangerUID); !strings.HasPrefix(out, "401 ") {
		t.Errorf("control off: the stranger through a plain listener got %q, want 401", out)
	}

	h.be.expect("List", 2)
	if out := runPeerChild(t, bin, sock, memberUID, groupGID); !strings.HasPrefix(out, "200 ") {
		t.Errorf("positive control: a member of the group got %q, want 200", out)
	}
	if out := peerHelper(sock); !strings.HasPrefix(out, "200 ") {
		t.Errorf("positive control: root got %q, want 200", out)
	}
	if len(refused) != 0 {
		t.Errorf("an admitted peer was audited as refused: %+v", <-refused)
	}
}

// shareableDir is a fresh directory every uid may traverse.
func shareableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "peercred-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// copyTestBinary copies the running test binary where any uid can run it.
func copyTestBinary(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "peer-client")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runPeerChild runs the helper as uid:gid with no supplementary groups.
func runPeerChild(t *testing.T, bin, sock string, uid, gid uint32) string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{envPeerHelper + "=" + sock, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}},
		Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("peer child as %d:%d: %v\n%s", uid, gid, err, out)
	}
	return strings.TrimSpace(string(out))
}
