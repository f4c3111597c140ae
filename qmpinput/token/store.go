package token

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/qmpinput/statedir"
)

// File names in the state directory.
const (
	FileName = "tokens.json"
	lockName = "tokens.lock"
	maxFile  = 1 << 20
	// keepExpired is how long an expired or revoked token stays listed.
	keepExpired = 24 * time.Hour
)

type file struct {
	Version int     `json:"version"`
	Tokens  []Token `json:"tokens"`
}

// Store is the token file in a state directory. Its methods are safe for
// concurrent use, also across processes (an exclusive lock guards every
// change). Close releases nothing but the directory handle it was given,
// which the caller owns.
type Store struct {
	dir *statedir.Dir
	now func() time.Time

	mu    sync.Mutex
	stamp [3]int64 // inode, mtime ns, size of the cached file
	cache map[string]Token
}

// Open returns the store in dir. now is the clock (nil: time.Now).
func Open(dir *statedir.Dir, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{dir: dir, now: now}
}

// Mint creates a token and returns it with its secret, which is shown
// once and never stored.
func (s *Store) Mint(role Role, ttl time.Duration, label string) (Token, Secret, error) {
	if err := checkMint(role, ttl, label); err != nil {
		return Token{}, "", err
	}
	id, secret, sum, err := newSecret()
	if err != nil {
		return Token{}, "", err
	}
	now := s.now().UTC().Truncate(time.Millisecond)
	t := Token{ID: id, Role: role, Label: label, Created: now, Expires: now.Add(ttl), SecretSHA256: sum}
	err = s.update(func(f *file) error {
		if len(f.Tokens) >= MaxTokens {
			return fmt.Errorf("%w: %d tokens stored (revoke some)", ErrInvalid, len(f.Tokens))
		}
		f.Tokens = append(f.Tokens, t)
		return nil
	})
	return t, secret, err
}

// Revoke marks the token id revoked and returns it. Revoking twice
// keeps the first time.
func (s *Store) Revoke(id string) (Token, error) {
	var out Token
	err := s.update(func(f *file) error {
		for i := range f.Tokens {
			if f.Tokens[i].ID == id {
				if f.Tokens[i].Revoked == nil {
					now := s.now().UTC().Truncate(time.Millisecond)
					f.Tokens[i].Revoked = &now
				}
				out = f.Tokens[i]
				return nil
			}
		}
		return fmt.Errorf("%w: no token %q", ErrUnknown, id)
	})
	return out, err
}

// Exchange checks a link's secret and marks the token used: it succeeds
// once per token, and only while the token is live.
func (s *Store) Exchange(secret Secret) (Token, error) {
	id, sum, err := secret.parse()
	if err != nil {
		return Token{}, err
	}
	var out Token
	err = s.update(func(f *file) error {
		for i := range f.Tokens {
			t := &f.Tokens[i]
			if t.ID != id || !t.matches(sum) {
				continue
			}
			if err := t.Live(s.now()); err != nil {
				return err
			}
			if t.Exchanged != nil {
				return fmt.Errorf("%w: token %s at %s", ErrUsed, t.ID, t.Exchanged.Format(time.RFC3339))
			}
			now := s.now().UTC().Truncate(time.Millisecond)
			t.Exchanged = &now
			out = *t
			return nil
		}
		return ErrUnknown
	})
	return out, err
}

// List returns every stored token, oldest first.
func (s *Store) List() ([]Token, error) {
	f, err := s.read()
	return f.Tokens, err
}

// Get returns the current state of token id, re-reading the file only
// when it changed since the last read.
func (s *Store) Get(id string) (Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.refresh(); err != nil {
		return Token{}, err
	}
	t, ok := s.cache[id]
	if !ok {
		return Token{}, fmt.Errorf("%w: no token %q", ErrUnknown, id)
	}
	return t, nil
}

// refresh reloads the cache if the file's inode, mtime or size changed.
func (s *Store) refresh() error {
	fh, err := s.dir.OpenFile(FileName, unix.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) {
		s.cache, s.stamp = map[string]Token{}, [3]int64{}
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStore, err)
	}
	defer fh.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(fh.Fd()), &st); err != nil {
		return fmt.Errorf("%w: %w", ErrStore, err)
	}
	stamp := [3]int64{int64(st.Ino), st.Mtim.Nano(), st.Size}
	if s.cache != nil && stamp == s.stamp {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(fh, maxFile+1))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStore, err)
	}
	f, err := decode(b)
	if err != nil {
		return err
	}
	s.cache = make(map[string]Token, len(f.Tokens))
	for _, t := range f.Tokens {
		s.cache[t.ID] = t
	}
	s.stamp = stamp
	return nil
}

// update runs fn on the file under the exclusive lock and writes the
// result atomically; tokens expired or revoked more than a day ago are
// dropped on the way.
func (s *Store) update(fn func(*file) error) error {
	unlock, err := s.dir.Lock(lockName)
	if err != nil {
		return fmt.Errorf("%w: lock: %w", ErrStore, err)
	}
	defer unlock()
	f, err := s.read()
	if err != nil {
		return err
	}
	if err := fn(&f); err != nil {
		return err
	}
	f.Tokens = s.prune(f.Tokens)
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := s.dir.WriteAtomic(FileName, append(b, '\n')); err != nil {
		return fmt.Errorf("%w: write: %w", ErrStore, err)
	}
	return nil
}

func (s *Store) prune(ts []Token) []Token {
	cut := s.now().Add(-keepExpired)
	out := ts[:0]
	for _, t := range ts {
		if t.Expires.Before(cut) || (t.Revoked != nil && t.Revoked.Before(cut)) {
			continue
		}
		out = append(out, t)
	}
	return out
}

func (s *Store) read() (file, error) {
	b, err := s.dir.ReadFile(FileName, maxFile)
	if errors.Is(err, os.ErrNotExist) {
		return file{Version: 1}, nil
	}
	if err != nil {
		return file{}, fmt.Errorf("%w: %w", ErrStore, err)
	}
	return decode(b)
}

// decode reads the token file strictly: unknown fields, trailing data,
// duplicate ids and invalid entries are refused.
func decode(b []byte) (file, error) {
	var f file
	if err := strictjson.Decode(b, maxFile, &f); err != nil {
		return file{}, fmt.Errorf("%w: %s: %w", ErrStore, FileName, err)
	}
	if f.Version != 1 || len(f.Tokens) > MaxTokens {
		return file{}, fmt.Errorf("%w: %s: version %d with %d tokens", ErrStore, FileName, f.Version, len(f.Tokens))
	}
	seen := map[string]bool{}
	for _, t := range f.Tokens {
		if seen[t.ID] || len(t.ID) != 2*idBytes || !isLowerHex(t.ID) || len(t.SecretSHA256) != 64 || (t.Role != RoleView && t.Role != RoleControl) {
			return file{}, fmt.Errorf("%w: %s: invalid or duplicate token %q", ErrStore, FileName, t.ID)
		}
		seen[t.ID] = true
	}
	sort.SliceStable(f.Tokens, func(i, j int) bool { return f.Tokens[i].Created.Before(f.Tokens[j].Created) })
	return f, nil
}
