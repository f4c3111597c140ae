package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hierarchies are the cgroup v1 hierarchies QEMU is placed in.
var hierarchies = []string{"memory", "pids", "cpuacct"}

// cgroups are QEMU's cgroups, one per hierarchy, all named name.
type cgroups struct {
	root, name string
}

func (c cgroups) dir(h string) string { return filepath.Join(c.root, h, c.name) }

// make creates the cgroups and sets the memory and pids limits.
func (c cgroups) make(memoryBytes int64) error {
	for _, h := range hierarchies {
		if err := os.Mkdir(c.dir(h), 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", h, err)
		}
	}
	limits := []struct{ h, file, value string }{
		{"memory", "memory.limit_in_bytes", strconv.FormatInt(memoryBytes, 10)},
		{"memory", "memory.memsw.limit_in_bytes", strconv.FormatInt(memoryBytes, 10)},
		{"pids", "pids.max", strconv.Itoa(qemuPids)},
	}
	for _, l := range limits {
		err := os.WriteFile(filepath.Join(c.dir(l.h), l.file), []byte(l.value), 0)
		if err != nil && !(l.file == "memory.memsw.limit_in_bytes" && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("cgroup limit %s: %w", l.file, err)
		}
	}
	return nil
}

// enter moves pid into every hierarchy's cgroup.
func (c cgroups) enter(pid int) error {
	for _, h := range hierarchies {
		if err := os.WriteFile(filepath.Join(c.dir(h), "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cgroup %s: place QEMU: %w", h, err)
		}
	}
	return nil
}

// procs lists the processes in the pids cgroup.
func (c cgroups) procs() ([]int, error) {
	data, err := os.ReadFile(filepath.Join(c.dir("pids"), "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// remove kills whatever runs in the cgroups, waits until they are empty
// and removes them; missing cgroups are already removed.
func (c cgroups) remove(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		ps, err := c.procs()
		if errors.Is(err, os.ErrNotExist) || len(ps) == 0 {
			break
		}
		for _, pid := range ps {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %d processes in cgroup %s survive SIGKILL", ErrLeftover, len(ps), c.name)
		case <-time.After(10 * time.Millisecond):
		}
	}
	var errs []error
	for _, h := range hierarchies {
		if err := removeCgroupDir(ctx, c.dir(h)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroupDir removes one cgroup directory, retrying while the
// kernel still counts a dying task in it.
func removeCgroupDir(ctx context.Context, dir string) error {
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: cgroup %s stays busy", ErrLeftover, dir)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// usage reads QEMU's CPU time and memory.
func (c cgroups) usage() (cpuSeconds float64, memoryBytes int64, err error) {
	read := func(h, file string) (int64, error) {
		b, err := os.ReadFile(filepath.Join(c.dir(h), file))
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	ns, err := read("cpuacct", "cpuacct.usage")
	if err != nil {
		return 0, 0, err
	}
	mem, err := read("memory", "memory.usage_in_bytes")
	return float64(ns) / 1e9, mem, err
}
