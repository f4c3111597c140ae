package acpmeta

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestExpectRoundTripAndRefusals(t *testing.T) {
	good := Expect{SHA256: strings.Repeat("ab", 32)}
	var meta map[string]any
	b, _ := json.Marshal(MergeMeta(good.Meta(), Op{}.Meta()))
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	got, ok, err := ExpectFromMeta(meta)
	if err != nil || !ok || got != good {
		t.Fatalf("round trip: %+v %v %v", got, ok, err)
	}
	if _, ok, err := ExpectFromMeta(map[string]any{}); ok || err != nil {
		t.Fatalf("absent key: ok=%v err=%v", ok, err)
	}
	bad := []any{
		map[string]any{"sha256": "ABCD"},
		map[string]any{"sha256": strings.Repeat("ab", 32), "absent": true},
		map[string]any{},
		map[string]any{"sha256": strings.Repeat("ab", 32), "extra": 1},
		"string",
	}
	for i, v := range bad {
		if _, ok, err := ExpectFromMeta(map[string]any{KeyExpect: v}); !ok || !errors.Is(err, ErrMeta) {
			t.Errorf("case %d: ok=%v err=%v, want ErrMeta", i, ok, err)
		}
	}
	if _, _, err := ExpectFromMeta(map[string]any{KeyExpect: map[string]any{"absent": true}}); err != nil {
		t.Errorf("absent precondition refused: %v", err)
	}
}

func TestMergeMetaPanicsOnDuplicate(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("duplicate key did not panic")
		}
	}()
	MergeMeta(Op{}.Meta(), Op{}.Meta())
}
