package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/httpserver"
	"github.com/tetherdev/tether/egress/policy"
)

// memBackend keeps computers in memory, owner-isolated as the service is.
type memBackend struct {
	mu  sync.Mutex
	cs  map[string]api.Computer
	n   int
	dir string // holds each computer's root (transfer_test.go)
	// egress holds each computer's policy (egress_test.go).
	egress map[string]policy.Policy
}

func (b *memBackend) Create(_ context.Context, c api.Caller, r api.CreateRequest) (api.Computer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	comp := api.Computer{ID: "c" + strings.Repeat("x", b.n), Owner: c.Owner, State: api.StateRunning, Tier: api.TierNamespaced,
		Limits: r.Limits, Labels: r.Labels, CreatedAt: time.Now().UTC(), IdleTimeoutSeconds: 900, Screen: r.Screen}
	b.cs[comp.ID] = comp
	return comp, nil
}

func (b *memBackend) find(c api.Caller, id string) (api.Computer, error) {
	comp, ok := b.cs[id]
	if !ok || (!c.Admin && comp.Owner != c.Owner) {
		return comp, api.Errorf(api.CodeNotFound, "no computer %q", id)
	}
	return comp, nil
}

func (b *memBackend) Get(_ context.Context, c api.Caller, id string) (api.Computer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.find(c, id)
}

func (b *memBackend) List(_ context.Context, c api.Caller) ([]api.Computer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []api.Computer
	for _, x := range b.cs {
		if c.Admin || x.Owner == c.Owner {
			out = append(out, x)
		}
	}
	return out, nil
}

func (b *memBackend) Delete(_ context.Context, c api.Caller, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.find(c, id); err != nil {
		return err
	}
	delete(b.cs, id)
	return nil
}

func (b *memBackend) Renew(_ context.Context, c api.Caller, id string, ttl time.Duration) (api.Computer, error) {
	return b.set(c, id, func(x *api.Computer) { x.LeaseExpiresAt = x.CreatedAt.Add(ttl) })
}

func (b *memBackend) Suspend(_ context.Context, c api.Caller, id string) (api.Computer, error) {
	return b.set(c, id, func(x *api.Computer) { x.State = api.StateSuspended })
}

func (b *memBackend) Resume(_ context.Context, c api.Caller, id string) (api.Computer, error) {
	return b.set(c, id, func(x *api.Computer) { x.State = api.StateRunning })
}

func (b *memBackend) set(c api.Caller, id string, f func(*api.Computer)) (api.Computer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, err := b.find(c, id)
	if err != nil {
		return x, err
	}
	f(&x)
	b.cs[id] = x
	return x, nil
}

func (b *memBackend) Events(ctx context.Context, _ api.Caller) (<-chan api.Event, error) {
	ch := make(chan api.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

// cmd runs the CLI and returns its exit code, stdout and stderr.
func cmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestCommandsOverUnixSocket drives every daemon command through the
// unix socket, as the test's own uid (its gid is the admitted group).
func TestCommandsOverUnixSocket(t *testing.T) {
	srv, err := httpserver.New(httpserver.Config{Backend: &memBackend{cs: map[string]api.Computer{}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "api.sock")
	gid := uint32(os.Getgid())
	l, err := httpserver.ListenUnix(sock, httpserver.PeerPolicy{Group: &gid}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	defer func() { cancel(); <-done }()

	code, out, errs := cmd(t, "create", "--socket", sock, "--memory", "268435456", "--ttl", "1h", "--label", "team=a")
	if code != 0 || !strings.Contains(out, `"team": "a"`) {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	id := "cx"
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"ls"}, id},
		{[]string{"show", id}, `"id": "cx"`},
		{[]string{"renew", id, "--ttl", "2h"}, `"lease_expires_at"`},
		{[]string{"suspend", id}, `"state": "suspended"`},
		{[]string{"resume", id}, `"state": "running"`},
		{[]string{"rm", id}, ""},
	}
	for _, s := range steps {
		code, out, errs := cmd(t, append(s.args, "--socket", sock)...)
		if code != 0 || !strings.Contains(out, s.want) {
			t.Errorf("%v: %d %q %q, want %q", s.args, code, out, errs, s.want)
		}
	}
	code, _, errs = cmd(t, "show", id, "--socket", sock)
	if code != exitFail || !strings.Contains(errs, "not_found") {
		t.Errorf("show after rm: %d %q, want exit 1 naming not_found", code, errs)
	}
}

// TestTokenAdd: the token is printed once and the file holds only its
// hash; a missing --owner is a usage error.
func TestTokenAdd(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.json")
	code, out, errs := cmd(t, "token", "add", "--file", file, "--owner", "alice")
	tok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(tok, httpserver.TokenPrefix) {
		t.Fatalf("token add: %d %q %q", code, out, errs)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(strings.TrimPrefix(tok, httpserver.TokenPrefix))) {
		t.Fatal("the token file holds the token")
	}
	toks, err := httpserver.OpenTokens(file)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := toks.Lookup(tok); !ok || c.Owner != "alice" || c.Admin {
		t.Errorf("lookup of the printed token: %+v %v, want alice, not admin", c, ok)
	}
	if code, _, _ := cmd(t, "token", "add", "--file", file); code != exitUsage {
		t.Errorf("token add without --owner: exit %d, want %d", code, exitUsage)
	}
}
