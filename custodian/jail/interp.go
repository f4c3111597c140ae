package jail

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// maxShebang bounds the first line read from a script (the kernel reads
// at most 256 bytes of it).
const maxShebang = 256

// interpreters returns what the kernel opens to execute path besides path
// itself: an ELF file's PT_INTERP (the dynamic loader), or a script's #!
// interpreter (and, for `#!/usr/bin/env NAME`, NAME found in the agent's
// PATH). Landlock checks the execute right on each of them.
func interpreters(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head := make([]byte, maxShebang)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	head = head[:n]
	if bytes.HasPrefix(head, []byte(elf.ELFMAG)) {
		return elfInterp(f)
	}
	interp, arg, ok := ParseShebang(head)
	if !ok {
		return nil, nil
	}
	out := []string{interp}
	if filepath.Base(interp) == "env" && arg != "" && !strings.HasPrefix(arg, "-") && !strings.Contains(arg, "/") {
		p, err := lookPath(arg, agentPath)
		if err != nil {
			return nil, fmt.Errorf("#!%s %s: %w", interp, arg, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// elfInterp reads the PT_INTERP of an ELF file (debug/elf does the
// parsing); a static binary has none.
func elfInterp(f *os.File) ([]string, error) {
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, fmt.Errorf("read ELF headers: %w", err)
	}
	for _, p := range ef.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		data, err := io.ReadAll(io.LimitReader(p.Open(), 4096))
		if err != nil {
			return nil, fmt.Errorf("read PT_INTERP: %w", err)
		}
		interp := string(bytes.TrimRight(data, "\x00"))
		if !filepath.IsAbs(interp) {
			return nil, fmt.Errorf("PT_INTERP %q is not absolute", interp)
		}
		return []string{filepath.Clean(interp)}, nil
	}
	return nil, nil
}

// ParseShebang reads a script's first line as the kernel does: "#!",
// optional blanks, the interpreter (up to a blank), then at most one
// argument (the rest of the line, trimmed). ok is false when head is not
// a script or names no absolute interpreter.
func ParseShebang(head []byte) (interp, arg string, ok bool) {
	rest, found := bytes.CutPrefix(head, []byte("#!"))
	if !found {
		return "", "", false
	}
	line, _, complete := bytes.Cut(rest, []byte("\n"))
	if !complete && len(head) >= maxShebang {
		return "", "", false // the kernel refuses a first line this long
	}
	fields := strings.TrimSpace(strings.TrimSuffix(string(line), "\r"))
	interp, arg, _ = strings.Cut(strings.ReplaceAll(fields, "\t", " "), " ")
	if interp == "" || !filepath.IsAbs(interp) || strings.ContainsRune(interp, 0) {
		return "", "", false
	}
	return filepath.Clean(interp), strings.TrimSpace(arg), true
}
