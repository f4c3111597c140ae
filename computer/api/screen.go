package api

import (
	"context"
	"time"
)

// Roles of a live-view link.
const (
	// LinkRoleView watches the screen.
	LinkRoleView = "view"
	// LinkRoleControl may also take over the input, hand it back, and
	// send keys and pointer events while it holds it.
	LinkRoleControl = "control"
)

// Bounds of a link's life.
const (
	DefaultLinkTTL = time.Hour
	MaxLinkTTL     = 24 * time.Hour
)

// LinkRequest is the body of POST /v1/computers/{id}/links.
type LinkRequest struct {
	// Role is LinkRoleView or LinkRoleControl.
	Role string `json:"role"`
	// TTLSeconds is how long the link may be opened, and the longest a
	// page opened with it stays; zero means DefaultLinkTTL, more than
	// MaxLinkTTL is refused.
	TTLSeconds int64 `json:"ttl_s,omitempty"`
}

// Link is the answer of POST /v1/computers/{id}/links: a one-time link
// to the computer's live view. The secret is in its fragment, shown
// once and stored only hashed; whoever opens it first is the viewer.
type Link struct {
	Link      string    `json:"link"`
	Role      string    `json:"role"`
	ExpiresAt time.Time `json:"expires_at"`
}

// CheckLink validates req and returns its TTL with the default applied;
// a refusal is bad_request.
func CheckLink(req LinkRequest) (time.Duration, error) {
	if req.Role != LinkRoleView && req.Role != LinkRoleControl {
		return 0, Errorf(CodeBadRequest, "role %q: want %q or %q", req.Role, LinkRoleView, LinkRoleControl)
	}
	switch {
	case req.TTLSeconds < 0 || req.TTLSeconds > int64(MaxLinkTTL/time.Second):
		return 0, Errorf(CodeBadRequest, "ttl_s is %d, want 0 to %d", req.TTLSeconds, int64(MaxLinkTTL/time.Second))
	case req.TTLSeconds == 0:
		return DefaultLinkTTL, nil
	}
	return time.Duration(req.TTLSeconds) * time.Second, nil
}

// ScreenProvisioner is implemented by provisioners that can give a
// machine a display (the VM tier). PrepareScreen is Prepare for a
// machine with a screen; the machine it returns is a Screen.
type ScreenProvisioner interface {
	PrepareScreen(ctx context.Context, dir string, limits Limits) (Machine, error)
}

// Screen is implemented by machines that serve a live view of their
// display. The service calls MintLink for the computer's owner or an
// admin only; label names who asked, on the page and in the view's
// audit log. The machine
// stops its view in KeepRecords (whose dst then keeps the view's audit
// log) or Close, whichever comes first.
type Screen interface {
	MintLink(ctx context.Context, role string, ttl time.Duration, label string) (Link, error)
}

// Attended is implemented by machines a person can take over (a VM
// with a screen). AttendedAt is when a person last held the machine's
// input: now while a take-over is in progress, typing or not; the
// moment it ended after that; the zero time if nobody has taken over.
// Watching the screen is not attending it. The service counts it as
// activity for the idle suspend.
type Attended interface {
	AttendedAt() time.Time
}
