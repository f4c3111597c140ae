package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/vm"
)

// TestServeVMTransport: `serve --vm-transport vsock` on a host where
// /dev/vhost-vsock does not open fails at start, naming the device,
// before anything is made; --vm-transport without --vm and an unknown
// transport are refused. (The choice where the device opens is
// computer/vm.TestChooseTransport's positive control; on a host where the
// device opens, the refusal without it is computer/vm's
// TestProvisionerRefusesVsockWithoutDevice, with a fake device, and here
// only the two refusals that hold on any host run.)
func TestServeVMTransport(t *testing.T) {
	dir := t.TempDir()
	type refusal struct {
		args []string
		want string
	}
	cases := []refusal{
		{[]string{"--vm-transport", "vsock"}, "--vm-transport needs --vm"},
		{[]string{"--vm", "tcg", "--vm-transport", "tcp"}, `unknown transport "tcp"`},
	}
	if f, err := os.OpenFile(vm.VhostVsockDevice, os.O_RDWR, 0); err == nil {
		f.Close()
	} else {
		cases = append(cases, refusal{[]string{"--vm", "tcg", "--vm-transport", "vsock"}, "open " + vm.VhostVsockDevice})
	}
	for _, tc := range cases {
		var stdout, stderr bytes.Buffer
		args := append([]string{"serve", "--dir", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "api.sock")}, tc.args...)
		code := run(context.Background(), args, &stdout, &stderr)
		if code == exitOK || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want a failure naming %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); !os.IsNotExist(err) {
		t.Fatalf("a refused serve made its state directory: %v", err)
	}
}
