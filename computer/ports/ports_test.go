package ports

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPickIsBelowTheEphemeralRangeAndBindable: the port is below the
// kernel's ephemeral range, at least lowest, and a listener on it works.
func TestPickIsBelowTheEphemeralRangeAndBindable(t *testing.T) {
	low, err := ephemeralLow(rangeFile)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		p, err := Pick()
		if err != nil {
			t.Fatal(err)
		}
		if int(p) < lowest || int(p) >= low {
			t.Fatalf("port %d outside [%d, %d)", p, lowest, low)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
}

// TestPickSkipsBusyPorts: a port the check calls busy is never
// returned, pick wraps around from its random start, and it fails when
// every port is busy or the range below the ephemeral one is empty.
func TestPickSkipsBusyPorts(t *testing.T) {
	onlyFree := uint16(lowest + 7)
	for range 50 {
		p, err := pick(lowest+10, func(p uint16) (bool, error) { return p == onlyFree, nil })
		if err != nil || p != onlyFree {
			t.Fatalf("pick = %d, %v; want %d (the only free one)", p, err, onlyFree)
		}
	}
	if _, err := pick(lowest+10, func(uint16) (bool, error) { return false, nil }); err == nil ||
		!strings.Contains(err.Error(), "no free TCP port") {
		t.Fatalf("pick with every port busy: %v", err)
	}
	if _, err := pick(lowest, free); err == nil {
		t.Fatal("pick with an empty range succeeded")
	}
}

// TestFreeSeesAListener: free reports a port held by a listener on
// 127.0.0.1 as busy, and the same port free once it is closed.
func TestFreeSeesAListener(t *testing.T) {
	p, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := free(p); ok || err != nil {
		t.Fatalf("free(%d) with a listener = %v, %v", p, ok, err)
	}
	l.Close()
	if ok, err := free(p); !ok || err != nil {
		t.Fatalf("free(%d) after close = %v, %v", p, ok, err)
	}
}

// TestEphemeralLowRefusesMalformedRanges: the range file must hold two
// fields and a valid first port.
func TestEphemeralLowRefusesMalformedRanges(t *testing.T) {
	dir := t.TempDir()
	for content, ok := range map[string]bool{"32768\t60999\n": true, "32768": false, "x 60999": false,
		"0 60999": false, "70000 80000": false, "": false} {
		path := filepath.Join(dir, "range")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		low, err := ephemeralLow(path)
		if (err == nil) != ok || (ok && low != 32768) {
			t.Errorf("ephemeralLow(%q) = %d, %v; ok %v", content, low, err, ok)
		}
	}
}

// FuzzParseLow: any content either fails or gives a port in 1..65535.
func FuzzParseLow(f *testing.F) {
	for _, s := range []string{"32768\t60999\n", "1024 65535", "32768", "x y", "-1 5", "65536 1", " 9 9 "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		low, err := parseLow(b)
		if err == nil && (low < 1 || low > 65535) {
			t.Fatalf("parseLow(%q) = %d", b, low)
		}
	})
}
