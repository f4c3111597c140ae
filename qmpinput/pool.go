package qmpinput

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// Pool defaults.
const (
	DefaultPoolBytes = 128 << 20
	DefaultPoolTTL   = 10 * time.Minute
)

// PoolFullError says how full the pool was when a capture was refused.
type PoolFullError struct {
	Used, Need, Max int64
}

func (e *PoolFullError) Error() string {
	return fmt.Sprintf("%v: %d bytes retained, %d more needed, limit %d (no unexpired capture is deleted)", ErrPoolFull, e.Used, e.Need, e.Max)
}

func (e *PoolFullError) Unwrap() error { return ErrPoolFull }

// pool retains capture files in the private capture directory, bounded in
// bytes. Entries expire ttl after they were last captured; expired entries
// are pruned before a new one is admitted, and a new capture that still
// does not fit is refused rather than evicting a recent one.
type pool struct {
	mu      sync.Mutex
	max     int64
	ttl     time.Duration
	used    int64
	entries map[string]*poolEntry // by SHA-256
}

type poolEntry struct {
	path string
	size int64
	last time.Time
}

func newPool(max int64, ttl time.Duration) *pool {
	return &pool{max: max, ttl: ttl, entries: map[string]*poolEntry{}}
}

// lookup reports whether sum is retained and refreshes its expiry.
func (p *pool) lookup(sum string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[sum]
	if ok {
		e.last = now
	}
	return ok
}

// admit adds the file at path (size bytes, digest sum) or refuses it with a
// *PoolFullError after pruning expired entries. On refusal the caller
// still owns path.
func (p *pool) admit(sum, path string, size int64, now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked(now)
	if p.used+size > p.max {
		return &PoolFullError{Used: p.used, Need: size, Max: p.max}
	}
	p.entries[sum] = &poolEntry{path: path, size: size, last: now}
	p.used += size
	return nil
}

// pruneLocked deletes expired entries and their files.
func (p *pool) pruneLocked(now time.Time) {
	for sum, e := range p.entries {
		if now.Sub(e.last) >= p.ttl {
			os.Remove(e.path)
			p.used -= e.size
			delete(p.entries, sum)
		}
	}
}

// read returns the retained bytes of sum.
func (p *pool) read(sum string) ([]byte, bool) {
	p.mu.Lock()
	e, ok := p.entries[sum]
	p.mu.Unlock()
	if !ok {
		return nil, false
	}
	b, err := os.ReadFile(e.path)
	return b, err == nil
}

// stats returns the bytes and entries retained.
func (p *pool) stats() (int64, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used, len(p.entries)
}
