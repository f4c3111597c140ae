package acpmeta

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
)

func tuple() admission.Tuple {
	return admission.Tuple{Owner: "alice", Allocation: "a1", Session: "s1", Workspace: "w1",
		Sandbox: "sb1", Generation: 1, Executor: "e1", Site: "local", Root: "/srv/tether/w1"}
}

// viaJSON mimics what a `_meta` map looks like after a JSON round trip.
func viaJSON(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBindRoundTrip(t *testing.T) {
	in := Bind{Tuple: tuple(), LeaseNotAfter: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	got, ok, err := BindFromMeta(viaJSON(t, in.Meta()))
	if err != nil || !ok || !got.Tuple.Equal(in.Tuple) || !got.LeaseNotAfter.Equal(in.LeaseNotAfter) {
		t.Fatalf("round trip = %+v ok=%v err=%v", got, ok, err)
	}
	if _, ok, err := BindFromMeta(map[string]any{"other": 1}); ok || err != nil {
		t.Fatalf("absent bind: ok=%v err=%v, want false, nil", ok, err)
	}
}

func TestBindRefusesMalformed(t *testing.T) {
	bad := map[string]any{
		"unknown field": map[string]any{"tuple": tuple(), "lease_not_after": "2026-12-01T00:00:00Z", "principal": "mallory"},
		"invalid tuple": map[string]any{"tuple": map[string]any{"owner": "alice"}, "lease_not_after": "2026-12-01T00:00:00Z"},
		"no lease":      map[string]any{"tuple": tuple()},
		"not object":    "bind me",
	}
	for name, v := range bad {
		_, ok, err := BindFromMeta(viaJSON(t, map[string]any{KeyBind: v}))
		if !ok || !errors.Is(err, ErrMeta) {
			t.Errorf("%s: ok=%v err=%v, want ok and ErrMeta", name, ok, err)
		}
	}
}

func TestOpFromMeta(t *testing.T) {
	good := Op{TupleSHA256: tuple().SHA256(), OpKey: "k-1", Deadline: time.Now().Add(time.Minute)}
	if _, err := OpFromMeta(viaJSON(t, good.Meta())); err != nil {
		t.Fatalf("good op refused: %v", err)
	}
	cases := map[string]Op{
		"upper digest": {TupleSHA256: "AB" + tuple().SHA256()[2:], OpKey: "k", Deadline: good.Deadline},
		"short digest": {TupleSHA256: "abc", OpKey: "k", Deadline: good.Deadline},
		"empty key":    {TupleSHA256: good.TupleSHA256, Deadline: good.Deadline},
		"slash key":    {TupleSHA256: good.TupleSHA256, OpKey: "a/b", Deadline: good.Deadline},
		"no deadline":  {TupleSHA256: good.TupleSHA256, OpKey: "k"},
	}
	for name, o := range cases {
		if _, err := OpFromMeta(viaJSON(t, o.Meta())); !errors.Is(err, ErrMeta) {
			t.Errorf("%s: err=%v, want ErrMeta", name, err)
		}
	}
	if _, err := OpFromMeta(nil); !errors.Is(err, ErrMeta) {
		t.Errorf("missing op: err=%v, want ErrMeta", err)
	}
}
