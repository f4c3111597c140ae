package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// Link mints a fake link for a screen computer's owner; conflict for a
// computer without a screen.
func (b *memBackend) Link(_ context.Context, c api.Caller, id string, req api.LinkRequest) (api.Link, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	comp, err := b.find(c, id)
	if err != nil {
		return api.Link{}, err
	}
	if !comp.Screen {
		return api.Link{}, api.Errorf(api.CodeConflict, "computer %s has no screen", id)
	}
	ttl, err := api.CheckLink(req)
	if err != nil {
		return api.Link{}, err
	}
	return api.Link{Link: "http://127.0.0.1:1/#t=s", Role: req.Role, ExpiresAt: time.Now().Add(ttl).UTC()}, nil
}

// TestLinkCommand: create --screen sends screen, show prints it, link
// prints the link as JSON with the role asked (control by default);
// a computer without a screen fails with conflict; a bad --ttl is a
// usage error.
func TestLinkCommand(t *testing.T) {
	_, sock := serveMem(t)
	code, out, errs := cmd(t, "create", "--socket", sock, "--screen", "--field", "id")
	if code != 0 {
		t.Fatalf("create --screen: %d %q %q", code, out, errs)
	}
	id := strings.TrimSpace(out)
	if code, out, _ := cmd(t, "show", "--socket", sock, "--field", "screen", id); code != 0 || strings.TrimSpace(out) != "true" {
		t.Fatalf("show --field screen: %d %q, want true", code, out)
	}
	for _, k := range []struct {
		args []string
		role string
	}{
		{nil, api.LinkRoleControl},
		{[]string{"--role", "view", "--ttl", "10m"}, api.LinkRoleView},
	} {
		code, out, errs := cmd(t, append(append([]string{"link", "--socket", sock}, k.args...), id)...)
		var l api.Link
		if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.Role != k.role || l.Link == "" {
			t.Fatalf("link %v: %d %q %q", k.args, code, out, errs)
		}
	}
	code, out, _ = cmd(t, "create", "--socket", sock, "--field", "id")
	plain := strings.TrimSpace(out)
	if code, _, errs := cmd(t, "link", "--socket", sock, plain); code != 1 || !strings.Contains(errs, "conflict") {
		t.Fatalf("link of a computer without a screen: %d %q, want 1 and conflict", code, errs)
	}
	if code, _, _ := cmd(t, "link", "--socket", sock, "--ttl", "25h", id); code != 2 {
		t.Fatalf("link --ttl 25h: %d, want the usage error 2", code)
	}
}
