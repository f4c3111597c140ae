package admission

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeTuple: DecodeTuple never panics; whatever it accepts is valid,
// and survives a JSON round trip with the same digest.
func FuzzDecodeTuple(f *testing.F) {
	f.Add([]byte(`{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/tether/w1"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tu, err := DecodeTuple(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidTuple) {
				t.Fatalf("error %v does not wrap ErrInvalidTuple", err)
			}
			return
		}
		if err := tu.Validate(); err != nil {
			t.Fatalf("accepted an invalid tuple %+v: %v", tu, err)
		}
		again, err := json.Marshal(tu)
		if err != nil {
			t.Fatal(err)
		}
		tu2, err := DecodeTuple(again)
		if err != nil || !tu2.Equal(tu) || tu2.SHA256() != tu.SHA256() {
			t.Fatalf("round trip of %+v: %+v, %v", tu, tu2, err)
		}
	})
}

// FuzzDecodeSnapshot: the payload decoder never panics; whatever it accepts
// is valid (no uid 0, no grant outliving the snapshot, ops from the closed
// set, positive limits) and survives a JSON round trip unchanged.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Add([]byte(issueInput))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeSnapshot(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidSnapshot) {
				t.Fatalf("error %v does not wrap ErrInvalidSnapshot", err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted an invalid snapshot: %v", err)
		}
		for _, g := range s.Grants {
			if g.UID == 0 || g.GID == 0 || g.NotAfter.After(s.NotAfter) {
				t.Fatalf("accepted grant %+v in a snapshot ending %s", g, s.NotAfter)
			}
		}
		again, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := DecodeSnapshot(again)
		if err != nil {
			t.Fatalf("re-encoded snapshot refused: %v\n%s", err, again)
		}
		if s2.Generation != s.Generation || !s2.NotAfter.Equal(s.NotAfter) || len(s2.Grants) != len(s.Grants) {
			t.Fatalf("round trip changed the snapshot: %+v vs %+v", s, s2)
		}
		for i := range s.Grants {
			if s2.Grants[i].Tuple.SHA256() != s.Grants[i].Tuple.SHA256() {
				t.Fatalf("round trip changed grant %d's tuple", i)
			}
		}
	})
}
