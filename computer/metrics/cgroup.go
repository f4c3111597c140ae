package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tetherdev/tether/computer/api"
)

// CgroupPaths names the cgroup directories of one computer. On a pure
// cgroup v2 host only V2 is set; on a hybrid host (v1 controllers, a
// cgroup2 mount without them) the v1 directories are set, and V2 may be
// set too. Each reading comes from its v1 directory when that is set and
// from V2 otherwise.
type CgroupPaths struct {
	V2      string // cgroup v2: cpu.stat usage_usec, memory.current, pids.current
	CPUAcct string // cgroup v1 cpuacct: cpuacct.usage (nanoseconds)
	Memory  string // cgroup v1 memory: memory.usage_in_bytes
	Pids    string // cgroup v1 pids: pids.current
}

// ErrNoCgroup says CgroupPaths names no directory a reading can come from.
var ErrNoCgroup = errors.New("check a cgroup directory is named for the reading")

// maxFile bounds what is read of one cgroup file; cpu.stat is the
// longest, a few hundred bytes.
const maxFile = 64 << 10

// ReadUsage reads one computer's CPU time, memory and pids from its
// cgroup files. The error names the file that could not be read or
// parsed.
func ReadUsage(p CgroupPaths) (api.Usage, error) {
	var u api.Usage
	var err error
	switch {
	case p.CPUAcct != "":
		var ns int64
		ns, err = readFile(filepath.Join(p.CPUAcct, "cpuacct.usage"), ParseCounter)
		u.CPUSeconds = float64(ns) / 1e9
	case p.V2 != "":
		var us int64
		us, err = readFile(filepath.Join(p.V2, "cpu.stat"), ParseCPUStat)
		u.CPUSeconds = float64(us) / 1e6
	default:
		err = fmt.Errorf("%w: cpu", ErrNoCgroup)
	}
	if err != nil {
		return api.Usage{}, err
	}
	if u.MemoryBytes, err = readEither(p.Memory, "memory.usage_in_bytes", p.V2, "memory.current"); err != nil {
		return api.Usage{}, err
	}
	if u.Pids, err = readEither(p.Pids, "pids.current", p.V2, "pids.current"); err != nil {
		return api.Usage{}, err
	}
	return u, nil
}

// readEither reads the counter v1File in v1Dir when v1Dir is set, else
// v2File in v2Dir.
func readEither(v1Dir, v1File, v2Dir, v2File string) (int64, error) {
	switch {
	case v1Dir != "":
		return readFile(filepath.Join(v1Dir, v1File), ParseCounter)
	case v2Dir != "":
		return readFile(filepath.Join(v2Dir, v2File), ParseCounter)
	}
	return 0, fmt.Errorf("%w: %s", ErrNoCgroup, v2File)
}

func readFile(path string, parse func([]byte) (int64, error)) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read cgroup file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return 0, fmt.Errorf("read cgroup file %s: %w", path, err)
	}
	if len(data) > maxFile {
		return 0, fmt.Errorf("read cgroup file %s: longer than %d bytes", path, maxFile)
	}
	n, err := parse(data)
	if err != nil {
		return 0, fmt.Errorf("parse cgroup file %s: %w", path, err)
	}
	return n, nil
}

// ErrMalformed says a cgroup file does not hold what its format says.
var ErrMalformed = errors.New("check the cgroup file's format")

// ParseCounter parses a cgroup file that holds one non-negative decimal
// integer and a newline (cpuacct.usage, memory.usage_in_bytes,
// memory.current, pids.current). The newline may be missing; nothing
// else may be there.
func ParseCounter(data []byte) (int64, error) {
	s := strings.TrimSuffix(string(data), "\n")
	return parseUint(s)
}

// parseUint parses a decimal integer of 0 to 2^63-1, digits only.
func parseUint(s string) (int64, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%w: %q is not a decimal integer", ErrMalformed, truncate(s))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: %w", ErrMalformed, truncate(s), err)
	}
	return n, nil
}

// ParseCPUStat returns usage_usec from a cgroup v2 cpu.stat file: lines
// of "key value", each key once. A line that is not two fields, or a
// usage_usec that is missing, repeated or not a decimal integer, is
// refused.
func ParseCPUStat(data []byte) (int64, error) {
	var usage int64 = -1
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Split(sc.Text(), " ")
		if len(f) != 2 || f[0] == "" {
			return 0, fmt.Errorf("%w: cpu.stat line %q is not \"key value\"", ErrMalformed, truncate(sc.Text()))
		}
		if f[0] != "usage_usec" {
			continue
		}
		if usage >= 0 {
			return 0, fmt.Errorf("%w: usage_usec appears twice", ErrMalformed)
		}
		n, err := parseUint(f[1])
		if err != nil {
			return 0, err
		}
		usage = n
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if usage < 0 {
		return 0, fmt.Errorf("%w: cpu.stat has no usage_usec", ErrMalformed)
	}
	return usage, nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
