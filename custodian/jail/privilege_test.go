package jail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// envNoPriv makes the test binary run noPrivMain (TestIntegrationStartRefusesWithoutPrivilege's child).
const envNoPriv = "TETHER_JAIL_TEST_NOPRIV"

// noPrivMain is the child TestIntegrationStartRefusesWithoutPrivilege
// starts as an unprivileged uid (TestMain runs it when envNoPriv is set):
// Start must refuse before anything is made, naming the missing
// capabilities and the opt-out. It prints "nopriv: ok" and exits 0 only
// then.
func noPrivMain() int {
	spec, err := Build(Options{Argv: []string{"/bin/true"}, Root: "/srv/w1", Env: os.Environ(), Helper: "/bin/true"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "nopriv: Build:", err)
		return 1
	}
	_, err = Start(spec, os.Stderr)
	if !errors.Is(err, ErrPrivilege) || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") || !strings.Contains(err.Error(), "--no-jail") {
		fmt.Fprintf(os.Stderr, "nopriv: Start as uid %d: %v; want ErrPrivilege naming CAP_SYS_ADMIN and --no-jail\n", os.Geteuid(), err)
		return 1
	}
	fmt.Println("nopriv: ok")
	return 0
}

func TestIntegrationStartRefusesWithoutPrivilege(t *testing.T) {
	testenv.Require(t, "root")
	s := newScene(t) // the test binary, copied where another uid can run it
	cmd := exec.Command(s.exe)
	cmd.Env = append(os.Environ(), envNoPriv+"=1")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nopriv: ok") {
		t.Fatalf("child as uid 65534: %v\n%s", err, out)
	}
}
