package admission

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// ExampleTuple is the tuple of docs/admission.md; tests in other packages
// copy it rather than import test code.
func exampleTuple() Tuple {
	return Tuple{Owner: "alice", Allocation: "a1", Session: "s1", Workspace: "w1",
		Sandbox: "sb1", Generation: 1, Executor: "e1", Site: "local", Root: "/srv/tether/w1"}
}

func TestTupleSHA256MatchesSpec(t *testing.T) {
	// Computed independently with:
	// printf 'owner=alice\nallocation=a1\n...root=/srv/tether/w1\n' | sha256sum
	const want = "bb2c9d4d661bfac504685c08bd660323e6f91cc6426c091428476cf5b9a62a54"
	if got := exampleTuple().SHA256(); got != want {
		t.Fatalf("SHA256() = %s, want %s", got, want)
	}
}

func TestTupleSHA256DependsOnEveryField(t *testing.T) {
	base := exampleTuple()
	seen := map[string]string{base.SHA256(): "base"}
	mutate := map[string]func(*Tuple){
		"owner":      func(t *Tuple) { t.Owner += "x" },
		"allocation": func(t *Tuple) { t.Allocation += "x" },
		"session":    func(t *Tuple) { t.Session += "x" },
		"workspace":  func(t *Tuple) { t.Workspace += "x" },
		"sandbox":    func(t *Tuple) { t.Sandbox += "x" },
		"generation": func(t *Tuple) { t.Generation++ },
		"executor":   func(t *Tuple) { t.Executor += "x" },
		"site":       func(t *Tuple) { t.Site += "x" },
		"root":       func(t *Tuple) { t.Root += "x" },
	}
	for name, m := range mutate {
		tu := base
		m(&tu)
		if tu.Equal(base) {
			t.Errorf("%s: Equal true after change", name)
		}
		if prev, dup := seen[tu.SHA256()]; dup {
			t.Errorf("%s: digest collides with %s", name, prev)
		}
		seen[tu.SHA256()] = name
	}
}

func TestTupleValidateRefuses(t *testing.T) {
	cases := map[string]func(*Tuple){
		"owner":       func(t *Tuple) { t.Owner = "" },
		"allocation":  func(t *Tuple) { t.Allocation = "" },
		"session":     func(t *Tuple) { t.Session = "" },
		"workspace":   func(t *Tuple) { t.Workspace = "" },
		"sandbox":     func(t *Tuple) { t.Sandbox = "" },
		"generation":  func(t *Tuple) { t.Generation = 0 },
		"executor":    func(t *Tuple) { t.Executor = "" },
		"site":        func(t *Tuple) { t.Site = "" },
		"root":        func(t *Tuple) { t.Root = "" },
		"NUL":         func(t *Tuple) { t.Owner = "al\x00ice" },
		"newline":     func(t *Tuple) { t.Session = "s1\nroot=/" },
		"relative":    func(t *Tuple) { t.Root = "srv/w1" },
		"unclean":     func(t *Tuple) { t.Root = "/srv/../etc" },
		"trailing /":  func(t *Tuple) { t.Root = "/srv/w1/" },
		"long fields": func(t *Tuple) { t.Site = strings.Repeat("x", maxFieldLen+1) },
	}
	for name, m := range cases {
		tu := exampleTuple()
		m(&tu)
		err := tu.Validate()
		if !errors.Is(err, ErrInvalidTuple) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidTuple", name, err)
		}
	}
	if err := exampleTuple().Validate(); err != nil {
		t.Fatalf("valid tuple refused: %v", err)
	}
}

func TestDecodeTupleStrict(t *testing.T) {
	good := `{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/tether/w1"}`
	got, err := DecodeTuple([]byte(good))
	if err != nil || !got.Equal(exampleTuple()) {
		t.Fatalf("DecodeTuple(good) = %+v, %v", got, err)
	}
	bad := map[string]string{
		"unknown field": strings.Replace(good, `"site"`, `"extra":1,"site"`, 1),
		"trailing":      good + `{}`,
		"missing root":  strings.Replace(good, `,"root":"/srv/tether/w1"`, "", 1),
		"neg gen":       strings.Replace(good, `"generation":1`, `"generation":-1`, 1),
		"string gen":    strings.Replace(good, `"generation":1`, `"generation":"1"`, 1),
	}
	for name, in := range bad {
		if _, err := DecodeTuple([]byte(in)); !errors.Is(err, ErrInvalidTuple) {
			t.Errorf("%s: err = %v, want ErrInvalidTuple", name, err)
		}
	}
}

func TestLeaseExtend(t *testing.T) {
	now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	cur := Lease{Tuple: exampleTuple(), NotAfter: now}
	later := Lease{Tuple: exampleTuple(), NotAfter: now.Add(time.Hour)}
	got, err := cur.Extend(later)
	if err != nil || !got.NotAfter.Equal(later.NotAfter) {
		t.Fatalf("same-tuple later extension refused: %v", err)
	}
	if _, err := cur.Extend(cur); !errors.Is(err, ErrLeaseNotLater) {
		t.Errorf("equal not_after: err = %v, want ErrLeaseNotLater", err)
	}
	earlier := Lease{Tuple: exampleTuple(), NotAfter: now.Add(-time.Hour)}
	if _, err := cur.Extend(earlier); !errors.Is(err, ErrLeaseNotLater) {
		t.Errorf("earlier not_after: err = %v, want ErrLeaseNotLater", err)
	}
	other := later
	other.Tuple.Generation = 2
	kept, err := cur.Extend(other)
	if !errors.Is(err, ErrTupleChanged) || !kept.NotAfter.Equal(now) {
		t.Errorf("changed tuple: err = %v, kept %v; want ErrTupleChanged and the old lease", err, kept.NotAfter)
	}
}
