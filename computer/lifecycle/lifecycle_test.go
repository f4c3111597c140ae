package lifecycle

import (
	"errors"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/api"
)

// legal is the expected edge set, written out again so a change of the
// table has to change this test too.
var legal = map[[2]string]bool{
	{None, api.StateQueued}:                 true,
	{api.StateQueued, api.StateCreating}:    true,
	{api.StateQueued, api.StateDeleted}:     true,
	{api.StateCreating, api.StateRunning}:   true,
	{api.StateCreating, api.StateExpiring}:  true,
	{api.StateCreating, api.StateFailed}:    true,
	{api.StateRunning, api.StateSuspended}:  true,
	{api.StateRunning, api.StateExpiring}:   true,
	{api.StateSuspended, api.StateRunning}:  true,
	{api.StateSuspended, api.StateExpiring}: true,
	{api.StateExpiring, api.StateDeleted}:   true,
	{api.StateExpiring, api.StateFailed}:    true,
}

// TestEveryIllegalTransitionRefused tries every pair of states (and the
// empty start) and expects exactly the legal edges to pass; each refusal
// names both states.
func TestEveryIllegalTransitionRefused(t *testing.T) {
	from := append([]string{None}, States...)
	passed := 0
	for _, f := range from {
		for _, to := range append([]string{None}, States...) {
			err := Check(f, to)
			if legal[[2]string{f, to}] {
				if err != nil {
					t.Errorf("%q → %q refused: %v", f, to, err)
				}
				passed++
				continue
			}
			if err == nil {
				t.Errorf("%q → %q accepted, want refused", f, to)
				continue
			}
			var te *TransitionError
			if !errors.As(err, &te) || te.From != f || te.To != to {
				t.Errorf("%q → %q: error %v does not name the transition", f, to, err)
			}
			if !strings.Contains(err.Error(), "→ "+to) {
				t.Errorf("message %q does not name the target", err)
			}
		}
	}
	if passed != len(legal) {
		t.Errorf("%d legal transitions passed, want %d", passed, len(legal))
	}
}

func TestUnknownStateRefused(t *testing.T) {
	for _, c := range [][2]string{{"paused", api.StateRunning}, {api.StateRunning, "paused"}} {
		if err := Check(c[0], c[1]); !errors.Is(err, ErrUnknownState) {
			t.Errorf("%q → %q: %v, want ErrUnknownState", c[0], c[1], err)
		}
	}
}

func TestFinal(t *testing.T) {
	for _, s := range States {
		want := s == api.StateDeleted || s == api.StateFailed
		if Final(s) != want {
			t.Errorf("Final(%q) = %v", s, !want)
		}
	}
}
