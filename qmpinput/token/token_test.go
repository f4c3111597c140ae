package token

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/qmpinput/statedir"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T) (*Store, *clock, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "state")
	d, err := statedir.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	c := &clock{t: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	return Open(d, c.now), c, p
}

// TestMintExchangeOnce: a minted link exchanges once; the stored file
// holds the secret's hash, never the secret.
func TestMintExchangeOnce(t *testing.T) {
	s, _, dir := newStore(t)
	tok, secret, err := s.Mint(RoleControl, time.Hour, "alice")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, FileName))
	sec := strings.SplitN(string(secret), ".", 2)[1]
	if strings.Contains(string(raw), sec) || !strings.Contains(string(raw), tok.SecretSHA256) {
		t.Fatalf("the token file holds the secret or lacks its hash:\n%s", raw)
	}
	got, err := s.Exchange(secret)
	if err != nil || got.ID != tok.ID || got.Role != RoleControl || got.Exchanged == nil {
		t.Fatalf("exchange: %+v %v", got, err)
	}
	if _, err := s.Exchange(secret); !errors.Is(err, ErrUsed) {
		t.Fatalf("second exchange: %v, want ErrUsed", err)
	}
	if g, err := s.Get(tok.ID); err != nil || g.Exchanged == nil || g.Actor() != "alice (token "+tok.ID+")" {
		t.Fatalf("get: %+v %v", g, err)
	}
}

// TestExchangeRefuses: wrong secret, malformed link, expired and revoked
// tokens never exchange.
func TestExchangeRefuses(t *testing.T) {
	s, c, _ := newStore(t)
	tok, secret, _ := s.Mint(RoleView, time.Minute, "")
	id := tok.ID
	forged := Secret(id + "." + strings.Repeat("A", 43))
	for _, bad := range []struct {
		s    Secret
		want error
	}{
		{forged, ErrUnknown},
		{Secret("ffffffffffffffff." + string(secret)[17:]), ErrUnknown},
		{Secret(id), ErrMalformed},
		{Secret(id + "." + string(secret)[17:] + "="), ErrMalformed},
		{Secret(strings.ToUpper(id) + "." + string(secret)[17:]), ErrMalformed},
		{"", ErrMalformed},
	} {
		if _, err := s.Exchange(bad.s); !errors.Is(err, bad.want) {
			t.Errorf("exchange %q: %v, want %v", bad.s, err, bad.want)
		}
	}
	c.add(time.Minute)
	if _, err := s.Exchange(secret); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired: %v", err)
	}
	_, s2, _ := s.Mint(RoleView, time.Hour, "")
	if _, err := s.Revoke(strings.SplitN(string(s2), ".", 2)[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exchange(s2); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked: %v", err)
	}
	if _, err := s.Revoke("0123456789abcdef"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("revoke unknown: %v", err)
	}
}

func TestMintBounds(t *testing.T) {
	s, _, _ := newStore(t)
	for _, c := range []struct {
		role  Role
		ttl   time.Duration
		label string
	}{{"admin", time.Hour, ""}, {RoleView, 0, ""}, {RoleView, 25 * time.Hour, ""}, {RoleView, time.Hour, "a\nb"},
		{RoleView, time.Hour, strings.Repeat("x", 65)}} {
		if _, _, err := s.Mint(c.role, c.ttl, c.label); !errors.Is(err, ErrInvalid) {
			t.Errorf("mint %+v: %v", c, err)
		}
	}
}

// TestGetSeesOtherWriters: a second store on the same directory (the
// CLI) revokes; the first (the server) sees it on its next check.
func TestGetSeesOtherWriters(t *testing.T) {
	s, c, dir := newStore(t)
	tok, _, _ := s.Mint(RoleControl, time.Hour, "")
	if g, err := s.Get(tok.ID); err != nil || g.Live(c.now()) != nil {
		t.Fatalf("%+v %v", g, err)
	}
	d2, err := statedir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := Open(d2, c.now).Revoke(tok.ID); err != nil {
		t.Fatal(err)
	}
	g, err := s.Get(tok.ID)
	if err != nil || !errors.Is(g.Live(c.now()), ErrRevoked) {
		t.Fatalf("after a revoke by another store: %+v %v", g, err)
	}
}

// TestConcurrentMintsKeepAll: mints from many stores at once lose none.
func TestConcurrentMintsKeepAll(t *testing.T) {
	_, c, dir := newStore(t)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := statedir.Open(dir)
			if err != nil {
				t.Error(err)
				return
			}
			defer d.Close()
			if _, _, err := Open(d, c.now).Mint(RoleView, time.Hour, ""); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	d, _ := statedir.Open(dir)
	defer d.Close()
	if ts, err := Open(d, c.now).List(); err != nil || len(ts) != 16 {
		t.Fatalf("%d tokens, %v", len(ts), err)
	}
}

// TestStoreRefusesTamperedFile: unknown fields, duplicates and trailing
// data in the token file fail closed.
func TestStoreRefusesTamperedFile(t *testing.T) {
	for _, body := range []string{
		`{"version":1,"tokens":[],"admin":true}`,
		`{"version":2,"tokens":[]}`,
		`{"version":1,"tokens":[]} {}`,
		`{"version":1,"tokens":[{"id":"0123456789abcdef","role":"control","created":"2026-12-01T10:00:00Z","expires":"2026-12-01T11:00:00Z","secret_sha256":"` + strings.Repeat("a", 64) + `"},{"id":"0123456789abcdef","role":"view","created":"2026-12-01T10:00:00Z","expires":"2026-12-01T11:00:00Z","secret_sha256":"` + strings.Repeat("b", 64) + `"}]}`,
		`{"version":1,"tokens":[{"id":"0123456789abcdef","role":"root","created":"2026-12-01T10:00:00Z","expires":"2026-12-01T11:00:00Z","secret_sha256":"` + strings.Repeat("a", 64) + `"}]}`,
	} {
		s, _, dir := newStore(t)
		os.WriteFile(filepath.Join(dir, FileName), []byte(body), 0o600)
		if _, err := s.List(); !errors.Is(err, ErrStore) {
			t.Errorf("%s: %v", body, err)
		}
		if _, err := s.Get("0123456789abcdef"); !errors.Is(err, ErrStore) {
			t.Errorf("get on %s: %v", body, err)
		}
	}
}
