package caps

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Status is the part of /proc/<pid>/status (or /proc/<pid>/task/<tid>/
// status) that proves a process's identity and privileges.
type Status struct {
	Name       string
	State      string // first letter of the State line: R, S, Z, ...
	Tgid, Pid  int
	PPid       int
	UID        [4]uint32 // real, effective, saved, filesystem
	GID        [4]uint32
	Groups     []uint32
	CapInh     uint64
	CapPrm     uint64
	CapEff     uint64
	CapBnd     uint64
	CapAmb     uint64
	NoNewPrivs int
}

// ErrStatus is wrapped by every malformed status file.
var ErrStatus = errors.New("malformed /proc status")

// maxStatusBytes bounds what ParseStatus reads; real files are ~1.5 KiB.
const maxStatusBytes = 64 << 10

// requiredStatusFields must each appear exactly once.
var requiredStatusFields = []string{"Name", "State", "Tgid", "Pid", "PPid", "Uid", "Gid",
	"Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs"}

// ParseStatus parses a status file's text. Every field of Status must be
// present exactly once and well formed; other lines are ignored.
func ParseStatus(data []byte) (Status, error) {
	if len(data) > maxStatusBytes {
		return Status{}, fmt.Errorf("%w: %d bytes, limit %d", ErrStatus, len(data), maxStatusBytes)
	}
	var st Status
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxStatusBytes)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		handled, err := st.setField(key, val)
		if err != nil {
			return Status{}, fmt.Errorf("%w: %s: %w", ErrStatus, key, err)
		}
		if !handled {
			continue
		}
		if seen[key] {
			return Status{}, fmt.Errorf("%w: %s appears twice", ErrStatus, key)
		}
		seen[key] = true
	}
	if err := sc.Err(); err != nil {
		return Status{}, fmt.Errorf("%w: %w", ErrStatus, err)
	}
	for _, f := range requiredStatusFields {
		if !seen[f] {
			return Status{}, fmt.Errorf("%w: %s missing", ErrStatus, f)
		}
	}
	return st, nil
}

// setField stores one known field; handled is false for other keys.
func (st *Status) setField(key, val string) (handled bool, err error) {
	switch key {
	case "Name":
		st.Name = val
	case "State":
		if val == "" {
			return true, errors.New("empty")
		}
		st.State = val[:1]
	case "Tgid":
		st.Tgid, err = parseInt(val)
	case "Pid":
		st.Pid, err = parseInt(val)
	case "PPid":
		st.PPid, err = parseInt(val)
	case "Uid":
		st.UID, err = parseIDs4(val)
	case "Gid":
		st.GID, err = parseIDs4(val)
	case "Groups":
		st.Groups, err = parseIDList(val)
	case "CapInh":
		st.CapInh, err = parseMask(val)
	case "CapPrm":
		st.CapPrm, err = parseMask(val)
	case "CapEff":
		st.CapEff, err = parseMask(val)
	case "CapBnd":
		st.CapBnd, err = parseMask(val)
	case "CapAmb":
		st.CapAmb, err = parseMask(val)
	case "NoNewPrivs":
		st.NoNewPrivs, err = parseInt(val)
	default:
		return false, nil
	}
	return true, err
}

func parseInt(s string) (int, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a non-negative integer", s)
	}
	return int(n), nil
}

// parseMask parses the 16 hex digits the kernel prints for a cap set.
func parseMask(s string) (uint64, error) {
	if len(s) != 16 {
		return 0, fmt.Errorf("%q is not 16 hex digits", s)
	}
	return strconv.ParseUint(s, 16, 64)
}

func parseIDs4(s string) ([4]uint32, error) {
	var out [4]uint32
	f := strings.Fields(s)
	if len(f) != 4 {
		return out, fmt.Errorf("%q has %d ids, want 4", s, len(f))
	}
	for i, x := range f {
		n, err := strconv.ParseUint(x, 10, 32)
		if err != nil {
			return out, fmt.Errorf("%q: %w", x, err)
		}
		out[i] = uint32(n)
	}
	return out, nil
}

func parseIDList(s string) ([]uint32, error) {
	out := []uint32{}
	for _, x := range strings.Fields(s) {
		n, err := strconv.ParseUint(x, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", x, err)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

// ReadStatus reads and parses the status file of a process ("/proc/PID/
// status") or of one thread ("/proc/PID/task/TID/status").
func ReadStatus(path string) (Status, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Status{}, err
	}
	st, err := ParseStatus(data)
	if err != nil {
		return Status{}, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// ThreadStatuses returns the status of every thread of process pid (0 for
// this process), keyed by thread id. A thread that ends while it is being
// read is left out.
func ThreadStatuses(pid int) (map[int]Status, error) {
	dir := "/proc/self/task"
	if pid != 0 {
		dir = fmt.Sprintf("/proc/%d/task", pid)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[int]Status, len(ents))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := ReadStatus(filepath.Join(dir, e.Name(), "status"))
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[tid] = st
	}
	return out, nil
}
