package durable

import (
	"os"
	"slices"
	"sync"

	"github.com/tetherdev/tether/admission/atomicfile"
)

// Syncs records the directories fsynced through atomicfile.DirSync while a test runs.
type Syncs struct {
	mu   sync.Mutex
	dirs []string
	// Before, if set, is called before each directory sync with its path.
	Before func(dir string)
}

// CountSyncs makes atomicfile.DirSync record every directory it fsyncs until restore
// is called (t.Cleanup(restore)). Only tests call it, never in parallel
// with each other.
func CountSyncs() (s *Syncs, restore func()) {
	s = &Syncs{}
	orig := atomicfile.DirSync
	atomicfile.DirSync = func(d *os.File) error {
		if s.Before != nil {
			s.Before(d.Name())
		}
		s.mu.Lock()
		s.dirs = append(s.dirs, d.Name())
		s.mu.Unlock()
		return orig(d)
	}
	return s, func() { atomicfile.DirSync = orig }
}

// Has reports whether dir was fsynced.
func (s *Syncs) Has(dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.dirs, dir)
}

// Dirs returns the directories fsynced so far, in order.
func (s *Syncs) Dirs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.dirs)
}
