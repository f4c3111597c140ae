package vmsuite

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Mutation is a deliberate breakage of the receiver, used only to show
// that suite (a) fails when a control is removed. It is applied as a
// `go -overlay` replacement of one source file while the suite's test
// binaries are built: the source tree never contains it, and no build
// without this runner's --mutate flag (in particular no Makefile build)
// can include it. The receipt of a mutated run carries the mutation in its
// suite name and as a problem, so it can never pass or be taken for the
// real one.
type Mutation struct {
	Name string // e.g. "keep-cap-kill"
	Doc  string // what it breaks
	File string // source file relative to the module root
	Old  string // text that must occur exactly once in File
	New  string // its replacement
}

// Mutations are the breakages issue 8 names.
var Mutations = []Mutation{
	{
		Name: "keep-cap-kill",
		Doc:  "CAP_KILL is left in the bounding set of the thread that forks children",
		File: "receiver/spawn/thread.go",
		Old:  "\tfor c := 0; c <= lastCap(); c++ {\n",
		New:  "\tfor c := 0; c <= lastCap(); c++ {\n\t\tif c == unix.CAP_KILL {\n\t\t\tcontinue // deliberate breakage (ci/vmsuite mutation)\n\t\t}\n",
	},
	{
		Name: "skip-no-new-privs",
		Doc:  "no_new_privs is not set on the thread that forks children",
		File: "receiver/spawn/thread.go",
		Old:  "\tif err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {\n",
		New:  "\tif err := error(nil); err != nil { // deliberate breakage (ci/vmsuite mutation)\n",
	},
}

// ErrMutation is wrapped when a mutation is unknown or no longer applies.
var ErrMutation = errors.New("mutation")

// FindMutation returns the named mutation.
func FindMutation(name string) (Mutation, error) {
	var names []string
	for _, m := range Mutations {
		if m.Name == name {
			return m, nil
		}
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return Mutation{}, fmt.Errorf("%w: unknown %q (known: %v)", ErrMutation, name, names)
}

// Apply returns the mutated contents of m.File under module root dir. The
// anchor text must occur exactly once: if the receiver changed so that it
// does not, the mutation fails loudly instead of silently testing nothing.
func (m Mutation) Apply(dir string) (string, []byte, error) {
	src := filepath.Join(dir, m.File)
	data, err := os.ReadFile(src)
	if err != nil {
		return "", nil, fmt.Errorf("%w %s: %w", ErrMutation, m.Name, err)
	}
	if n := bytes.Count(data, []byte(m.Old)); n != 1 {
		return "", nil, fmt.Errorf("%w %s: its anchor occurs %d times in %s (want exactly 1); update ci/vmsuite/mutate.go to the receiver's current code",
			ErrMutation, m.Name, n, m.File)
	}
	return src, bytes.Replace(data, []byte(m.Old), []byte(m.New), 1), nil
}

// Overlay writes an overlay file applying ms under dir into work and
// returns its path ("" when ms is empty).
func Overlay(dir, work string, ms []Mutation) (string, error) {
	if len(ms) == 0 {
		return "", nil
	}
	files := map[string][]byte{}
	for _, m := range ms {
		src, data, err := m.Apply(dir)
		if err != nil {
			return "", err
		}
		if _, dup := files[src]; dup {
			return "", fmt.Errorf("%w: two mutations of %s", ErrMutation, m.File)
		}
		files[src] = data
	}
	return writeOverlay(work, files)
}
