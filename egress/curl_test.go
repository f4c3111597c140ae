package egress_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestCurlShowsTheRefusal: real curl through the proxy shows why it was
// refused, for plain HTTP (the body) and for HTTPS (CONNECT's status
// line); with loopback lifted (positive control) the same fetch works.
func TestCurlShowsTheRefusal(t *testing.T) {
	testenv.Require(t, "devtools")
	up := startUpstream(t, "127.0.0.1:0", nil)
	l := newLab(t, egress.Config{})
	on, _ := l.attach(t, "on", allowPort(up.port))
	off, _ := l.attach(t, "off", allowPort(up.port, "lab"))
	curl := func(args ...string) string {
		out, _ := exec.Command("curl", append([]string{"-sS", "--max-time", "20", "--noproxy", ""}, args...)...).CombinedOutput()
		return string(out)
	}
	target := "http://" + hostPortStr("127.0.0.1", up.port) + "/"
	if out := curl("-x", "http://"+on, target); !strings.Contains(out, "tether egress refused") ||
		!strings.Contains(out, "127.0.0.1 is loopback") {
		t.Errorf("curl http through the proxy: %q", out)
	}
	if out := curl("-v", "-x", "http://"+on, "https://pypi.org/simple/"); !strings.Contains(out,
		"403 Forbidden by tether egress: no allow rule of the computer's egress policy matches pypi.org:443") {
		t.Errorf("curl https through the proxy: %q", out)
	}
	if out := curl("-x", "http://"+off, target); !strings.HasPrefix(out, "hello from") {
		t.Errorf("positive control: %q", out)
	}
}
