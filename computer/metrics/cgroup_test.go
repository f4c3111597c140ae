package metrics

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestParseCounter(t *testing.T) {
	for in, want := range map[string]int64{"0\n": 0, "123": 123, "9223372036854775807\n": 1<<63 - 1} {
		if got, err := ParseCounter([]byte(in)); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "\n", "-1\n", "+1", " 1", "1 \n", "1\n\n", "0x10", "9223372036854775808", "max\n", "1.5"} {
		if got, err := ParseCounter([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %d %v, want ErrMalformed", in, got, err)
		}
	}
}

func TestParseCPUStat(t *testing.T) {
	const real = "usage_usec 2516133\nuser_usec 1803419\nsystem_usec 712714\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
	if got, err := ParseCPUStat([]byte(real)); err != nil || got != 2516133 {
		t.Fatalf("got %d %v", got, err)
	}
	for _, in := range []string{"", "user_usec 1\n", "usage_usec\n", "usage_usec 1 2\n", "usage_usec -1\n",
		"usage_usec 1\nusage_usec 2\n", " usage_usec 1\n", "usage_usec 1\ngarbage\n", "usage_usec  1\n"} {
		if got, err := ParseCPUStat([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %d %v, want ErrMalformed", in, got, err)
		}
	}
}

// FuzzParseCounter: whatever the bytes, the parser returns a
// non-negative value whose decimal form is the input (less one newline),
// or ErrMalformed.
func FuzzParseCounter(f *testing.F) {
	f.Add([]byte("123\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := ParseCounter(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error without ErrMalformed: %v", err)
			}
			return
		}
		digits := strings.TrimLeft(strings.TrimSuffix(string(data), "\n"), "0")
		if digits == "" {
			digits = "0"
		}
		if n < 0 || strconv.FormatInt(n, 10) != digits {
			t.Fatalf("%q parsed as %d", data, n)
		}
	})
}

// FuzzParseCPUStat: the parser never panics and returns a non-negative
// value or ErrMalformed.
func FuzzParseCPUStat(f *testing.F) {
	f.Add([]byte("usage_usec 1\nuser_usec 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := ParseCPUStat(data)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error without ErrMalformed: %v", err)
		}
		if err == nil && n < 0 {
			t.Fatalf("%q parsed as %d", data, n)
		}
	})
}

// TestReadUsageFiles: each reading comes from its v1 file when the v1
// directory is named and from the v2 file otherwise; a reading with no
// directory, a missing file and a malformed file each fail, naming it.
func TestReadUsageFiles(t *testing.T) {
	v1, v2 := t.TempDir(), t.TempDir()
	write := func(dir, name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(v1, "cpuacct.usage", "2500000000\n")
	write(v1, "memory.usage_in_bytes", "4096\n")
	write(v1, "pids.current", "3\n")
	write(v2, "cpu.stat", "usage_usec 1500000\nuser_usec 1\n")
	write(v2, "memory.current", "8192\n")
	write(v2, "pids.current", "5\n")
	for _, tc := range []struct {
		name string
		p    CgroupPaths
		want float64
		mem  int64
		pids int64
	}{
		{"v1", CgroupPaths{CPUAcct: v1, Memory: v1, Pids: v1}, 2.5, 4096, 3},
		{"v2", CgroupPaths{V2: v2}, 1.5, 8192, 5},
		{"hybrid", CgroupPaths{V2: v2, Memory: v1, Pids: v1}, 1.5, 4096, 3},
	} {
		u, err := ReadUsage(tc.p)
		if err != nil || u.CPUSeconds != tc.want || u.MemoryBytes != tc.mem || u.Pids != tc.pids {
			t.Errorf("%s: %+v %v", tc.name, u, err)
		}
	}
	if _, err := ReadUsage(CgroupPaths{CPUAcct: v1, Memory: v1}); !errors.Is(err, ErrNoCgroup) {
		t.Errorf("no pids directory: %v", err)
	}
	if _, err := ReadUsage(CgroupPaths{CPUAcct: v2, Memory: v1, Pids: v1}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing cpuacct.usage: %v", err)
	}
	write(v1, "pids.current", "max\n")
	if _, err := ReadUsage(CgroupPaths{CPUAcct: v1, Memory: v1, Pids: v1}); !errors.Is(err, ErrMalformed) {
		t.Errorf("malformed pids.current: %v", err)
	}
}
