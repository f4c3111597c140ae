package vmsuite

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tetherdev/tether/fixtures/guest"
)

// libDirs is where a Debian amd64 host keeps shared libraries.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// HostProgram returns the image files that make the host program at path
// run in the guest at the same path: the program, and, if it is
// dynamically linked, its interpreter and every shared library it needs
// (transitively), each at its host path. The guest runs the host's real
// binary (e.g. capsh from libcap2-bin), not a substitute.
func HostProgram(path string) ([]guest.File, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	files := []guest.File{{Path: path, Source: real, Mode: 0o755}}
	seen := map[string]bool{path: true}
	queue := []string{real}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		deps, err := elfDeps(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, d := range deps {
			if seen[d] {
				continue
			}
			seen[d] = true
			src, err := filepath.EvalSymlinks(d)
			if err != nil {
				return nil, err
			}
			files = append(files, guest.File{Path: d, Source: src, Mode: 0o755})
			queue = append(queue, src)
		}
	}
	return files, nil
}

// elfDeps returns the interpreter and the resolved DT_NEEDED libraries of
// the ELF file at p (none for a static binary).
func elfDeps(p string) ([]string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var deps []string
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return nil, err
			}
			deps = append(deps, string(b[:len(b)-1])) // NUL-terminated
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, err
	}
	for _, n := range needed {
		lib, err := findLib(n)
		if err != nil {
			return nil, err
		}
		deps = append(deps, lib)
	}
	return deps, nil
}

func findLib(name string) (string, error) {
	for _, d := range libDirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("shared library %s not found in %v", name, libDirs)
}
