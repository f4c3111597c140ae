package provision

import (
	"strconv"
	"strings"
	"testing"
)

// TestStatField: the value of a key in a flat-keyed cgroup file, and a
// refusal of a missing key, a negative or non-numeric value.
func TestStatField(t *testing.T) {
	stat := "usage_usec 60541\nuser_usec 60000\nsystem_usec 541\n"
	if n, err := statField(stat, "usage_usec"); n != 60541 || err != nil {
		t.Fatalf("usage_usec = %d, %v", n, err)
	}
	for _, bad := range []string{"", "usage_usecs 1\n", "usage_usec -1\n", "usage_usec x\n", "usage_usec\n"} {
		if n, err := statField(bad, "usage_usec"); err == nil {
			t.Errorf("statField(%q) = %d, want an error", bad, n)
		}
	}
}

// FuzzStatField: statField never panics, and a value it returns is not
// negative and is the number written after the key on one of the lines.
func FuzzStatField(f *testing.F) {
	f.Add("usage_usec 60541\nuser_usec 60000\n", "usage_usec")
	f.Add("frozen 1\npopulated 0\n", "frozen")
	f.Fuzz(func(t *testing.T, text, key string) {
		n, err := statField(text, key)
		if err != nil {
			return
		}
		found := false
		for l := range strings.Lines(text) {
			v, ok := strings.CutPrefix(strings.TrimSpace(l), key+" ")
			if m, err := strconv.ParseInt(v, 10, 64); ok && err == nil && m == n {
				found = true
			}
		}
		if n < 0 || !found {
			t.Fatalf("statField(%q, %q) = %d", text, key, n)
		}
	})
}
