package receiver

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
)

// A grant's resource limits (max_pids, max_memory_bytes, max_disk_bytes,
// max_open_files, max_file_size_bytes) bound the whole computer, and the
// computer enforces them: cgroup limits on the cgroups commands run in,
// the receiver's own resource limits (which every command inherits), the
// size of the root's file system. The receiver cannot raise or set any
// of them (it has neither CAP_SYS_RESOURCE nor CAP_SYS_ADMIN), so before
// every command it checks that each limit the grant sets is enforced at
// least as tightly, and refuses the command otherwise: a grant is never
// silently looser in practice than it reads.

// enforcement is where the receiver reads the computer's limits.
type enforcement struct {
	v2 string   // the cgroup v2 parent of command cgroups, "" when off
	v1 []string // cgroup v1 directories commands start in
}

func newEnforcement(c CgroupConfig) enforcement {
	e := enforcement{}
	if c.Mode == CgroupRequired {
		e.v2 = c.Parent
	}
	for _, v := range c.V1 {
		e.v1 = append(e.v1, v.Commands)
	}
	return e
}

// unlimited stands for "max" and RLIM_INFINITY.
const unlimited = math.MaxInt64

// check refuses (denied, naming the limit and what enforces it) unless
// every resource limit g sets is enforced at or below its value.
func (e enforcement) check(g admission.Grant) error {
	l := g.Limits
	for _, c := range []struct {
		name string
		want int64
		have func() (int64, string)
	}{
		{"max_pids", l.MaxPids, e.pids},
		{"max_pids", l.MaxPids, rlimit(unix.RLIMIT_NPROC, "RLIMIT_NPROC")},
		{"max_memory_bytes", l.MaxMemoryBytes, e.memory},
		{"max_disk_bytes", l.MaxDiskBytes, disk(g.Tuple.Root)},
		{"max_open_files", l.MaxOpenFiles, rlimit(unix.RLIMIT_NOFILE, "RLIMIT_NOFILE")},
		{"max_file_size_bytes", l.MaxFileSizeBytes, rlimit(unix.RLIMIT_FSIZE, "RLIMIT_FSIZE")},
	} {
		if c.want <= 0 {
			continue
		}
		if have, what := c.have(); have > c.want {
			return errcode.Errorf(errcode.CodeDenied, "grant limit %s %d is not enforced by this computer: %s", c.name, c.want, what)
		}
	}
	return nil
}

// rlimit reads the receiver's hard limit of resource, which every command
// inherits and none can raise.
func rlimit(resource int, name string) func() (int64, string) {
	return func() (int64, string) {
		var r unix.Rlimit
		if err := unix.Getrlimit(resource, &r); err != nil {
			return unlimited, fmt.Sprintf("%s unreadable: %v", name, err)
		}
		if r.Max > math.MaxInt64 {
			return unlimited, name + " is unlimited"
		}
		return int64(r.Max), fmt.Sprintf("%s is %d", name, r.Max)
	}
}

// disk reads the size of the file system the root lives on.
func disk(root string) func() (int64, string) {
	return func() (int64, string) {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err != nil {
			return unlimited, fmt.Sprintf("statfs %s: %v", root, err)
		}
		size := int64(st.Blocks) * st.Bsize
		return size, fmt.Sprintf("the root's file system holds %d bytes", size)
	}
}

// pids is the tightest pids.max of the cgroups commands run in.
func (e enforcement) pids() (int64, string) {
	return e.tightest("pids.max", "pids.max", "", "")
}

// memory is the tightest memory limit, swap included, of the cgroups
// commands run in: v2 memory.max plus memory.swap.max, v1
// memory.memsw.limit_in_bytes (memory.limit_in_bytes without swap
// accounting).
func (e enforcement) memory() (int64, string) {
	return e.tightest("memory.max", "memory.memsw.limit_in_bytes", "memory.swap.max", "memory.limit_in_bytes")
}

// tightest reads v2File (plus v2Extra, when it exists) in the v2 parent
// and v1File (else v1Fallback) in every v1 cgroup, and returns the
// smallest, naming it; unlimited when none holds a limit.
func (e enforcement) tightest(v2File, v1File, v2Extra, v1Fallback string) (int64, string) {
	best, what := int64(unlimited), "no cgroup of the commands limits it"
	consider := func(v int64, path string) {
		if v < best {
			best, what = v, fmt.Sprintf("%s is %d", path, v)
		}
	}
	if e.v2 != "" {
		if v, err := readLimit(filepath.Join(e.v2, v2File)); err == nil {
			if x, err := readLimit(filepath.Join(e.v2, v2Extra)); v2Extra != "" && err == nil {
				v = addLimits(v, x)
			}
			consider(v, filepath.Join(e.v2, v2File))
		}
	}
	for _, d := range e.v1 {
		p := filepath.Join(d, v1File)
		v, err := readLimit(p)
		if errors.Is(err, os.ErrNotExist) && v1Fallback != "" {
			p = filepath.Join(d, v1Fallback)
			v, err = readLimit(p)
		}
		if err == nil {
			consider(v, p)
		}
	}
	return best, what
}

// readLimit reads a cgroup limit file: a number, or "max" (unlimited).
func readLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return unlimited, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a limit", path, s)
	}
	return v, nil
}

func addLimits(a, b int64) int64 {
	if a > unlimited-b {
		return unlimited
	}
	return a + b
}
