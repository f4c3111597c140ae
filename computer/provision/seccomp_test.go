package provision

import (
	"fmt"
	"strings"
	"testing"
)

// TestIntegrationAttackUserNamespace: a command in a namespaced computer
// runs under exactly one seccomp filter and cannot make a user namespace
// (util-linux unshare -U), where the same command in a computer whose
// receiver has seccomp off (the positive control) makes one.
func TestIntegrationAttackUserNamespace(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("seccomp-off=%v", off), func(t *testing.T) {
			c := isolated(t, Options{seccompOff: off})
			r := runIn(t, c, "grep Seccomp /proc/self/status; unshare -U true && echo USERNS-MADE; true")
			filtered := strings.HasPrefix(r.out, "Seccomp:\t2\nSeccomp_filters:\t1\n") &&
				strings.Contains(r.out, "Operation not permitted") && !strings.Contains(r.out, "USERNS-MADE")
			open := strings.HasPrefix(r.out, "Seccomp:\t0\nSeccomp_filters:\t0\n") && strings.Contains(r.out, "USERNS-MADE")
			if off && !open || !off && !filtered {
				t.Fatalf("seccomp off %v: %v", off, r)
			}
		})
	}
}
