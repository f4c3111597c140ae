package provision

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tetherdev/tether/computer/api"
)

// ErrNoUsage: a reading the computer's cgroups do not hold (a computer
// without namespaces has no cgroups of its own).
var ErrNoUsage = errors.New("computer: no cgroup holds this reading")

// Usage reads the CPU time, memory and process count of the computer's
// commands from its cgroups: the cgroup2 parent's cpu.stat,
// memory.current and pids.current where it has them, else the v1
// commands/ cgroups' cpuacct.usage, memory.usage_in_bytes and
// pids.current. The receiver is in none of them.
func (c *Local) Usage() (api.Usage, error) { return c.State().usage() }

func (s State) usage() (api.Usage, error) {
	var u api.Usage
	cpu, err := s.cpuSeconds()
	if err != nil {
		return u, err
	}
	mem, err := s.counter("memory.current", "memory.usage_in_bytes")
	if err != nil {
		return u, err
	}
	pids, err := s.counter("pids.current", "pids.current")
	if err != nil {
		return u, err
	}
	return api.Usage{CPUSeconds: cpu, MemoryBytes: mem, Pids: pids}, nil
}

// cpuSeconds reads usage_usec of the parent's cpu.stat, else
// cpuacct.usage (nanoseconds) of the v1 commands/ cgroup.
func (s State) cpuSeconds() (float64, error) {
	if s.CgroupParent != "" {
		b, err := os.ReadFile(filepath.Join(s.CgroupParent, "cpu.stat"))
		if err == nil {
			us, err := statField(string(b), "usage_usec")
			return float64(us) / 1e6, err
		}
	}
	if d := s.v1Commands("cpuacct.usage"); d != "" {
		ns, err := readInt(filepath.Join(d, "cpuacct.usage"))
		return float64(ns) / 1e9, err
	}
	return 0, fmt.Errorf("%w: cpu time", ErrNoUsage)
}

// counter reads the v1 commands/ cgroup's v1 file where a v1 hierarchy
// has it (the limits live there on a hybrid host), else the cgroup2
// parent's v2 file.
func (s State) counter(v2, v1 string) (int64, error) {
	if d := s.v1Commands(v1); d != "" {
		return readInt(filepath.Join(d, v1))
	}
	if s.CgroupParent != "" {
		if _, err := os.Lstat(filepath.Join(s.CgroupParent, v2)); err == nil {
			return readInt(filepath.Join(s.CgroupParent, v2))
		}
	}
	return 0, fmt.Errorf("%w: %s", ErrNoUsage, v2)
}

// readInt reads a cgroup file holding one decimal number.
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("computer: %s holds %q, not a count", path, b)
	}
	return n, nil
}

// statField returns the value of key in a cgroup2 flat-keyed file
// ("key value" lines, as cpu.stat).
func statField(text, key string) (int64, error) {
	for l := range strings.Lines(text) {
		k, v, ok := strings.Cut(strings.TrimSpace(l), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("computer: %s %q is not a count", key, v)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("computer: no %s in %q", key, text)
}
