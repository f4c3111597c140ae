package vm

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tetherdev/tether/qmpinput/token"
)

// TestClipLabel: a label for any caller fits the token store's bound,
// whole runes, printable only; a short one is kept as it is.
func TestClipLabel(t *testing.T) {
	if got := clipLabel("control link for owner alice"); got != "control link for owner alice" {
		t.Fatalf("short label changed: %q", got)
	}
	long := "view link for admin " + strings.Repeat("é", 60) + "\n\x00"
	got := clipLabel(long)
	if len(got) > token.MaxLabel || !utf8.ValidString(got) || strings.ContainsAny(got, "\n\x00") || !strings.HasPrefix(got, "view link for admin é") {
		t.Fatalf("clipLabel(%q) = %q (%d bytes)", long, got, len(got))
	}
}
