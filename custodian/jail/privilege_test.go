package jail

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// envNoPriv makes the test binary TestStartWithoutPrivilegeChild's child.
const envNoPriv = "TETHER_JAIL_TEST_NOPRIV"

// TestStartWithoutPrivilegeChild runs as an unprivileged uid (started by
// TestIntegrationStartRefusesWithoutPrivilege): Start must refuse before
// anything is made, naming the missing capabilities and the opt-out.
func TestStartWithoutPrivilegeChild(t *testing.T) {
	if os.Getenv(envNoPriv) != "1" {
		t.Skip("child of TestIntegrationStartRefusesWithoutPrivilege")
	}
	spec, err := Build(Options{Argv: []string{"/bin/true"}, Root: "/srv/w1", Env: os.Environ(), Helper: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Start(spec, os.Stderr)
	if !errors.Is(err, ErrPrivilege) || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") || !strings.Contains(err.Error(), "--no-jail") {
		t.Fatalf("Start as uid %d: %v; want ErrPrivilege naming CAP_SYS_ADMIN and --no-jail", os.Geteuid(), err)
	}
}

func TestIntegrationStartRefusesWithoutPrivilege(t *testing.T) {
	testenv.Require(t, "root")
	s := newScene(t) // the test binary, copied where another uid can run it
	cmd := exec.Command(s.exe, "-test.run=^TestStartWithoutPrivilegeChild$", "-test.v")
	cmd.Env = append(os.Environ(), envNoPriv+"=1")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestStartWithoutPrivilegeChild") {
		t.Fatalf("child as uid 65534: %v\n%s", err, out)
	}
}
