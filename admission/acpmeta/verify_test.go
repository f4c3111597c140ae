package acpmeta

import (
	"errors"
	"strings"
	"testing"
)

func TestVerifyFromMeta(t *testing.T) {
	d := strings.Repeat("a", 64)
	good := Verify{Files: map[string]string{"out/result.txt": d}}
	got, ok, err := VerifyFromMeta(viaJSON(t, good.Meta()))
	if err != nil || !ok || got.Files["out/result.txt"] != d {
		t.Fatalf("round trip = %+v %v %v", got, ok, err)
	}
	if _, ok, err := VerifyFromMeta(map[string]any{}); ok || err != nil {
		t.Fatalf("absent: ok=%v err=%v", ok, err)
	}
	bad := map[string]Verify{
		"absolute": {Files: map[string]string{"/etc/passwd": d}},
		"dotdot":   {Files: map[string]string{"../x": d}},
		"unclean":  {Files: map[string]string{"a//b": d}},
		"digest":   {Files: map[string]string{"a": "ABC"}},
		"empty":    {Files: map[string]string{}},
	}
	for name, v := range bad {
		if _, ok, err := VerifyFromMeta(viaJSON(t, v.Meta())); !ok || !errors.Is(err, ErrMeta) {
			t.Errorf("%s: ok=%v err=%v, want ErrMeta", name, ok, err)
		}
	}
	extra := map[string]any{KeyVerify: map[string]any{"files": map[string]any{"a": d}, "mode": "lenient"}}
	if _, _, err := VerifyFromMeta(viaJSON(t, extra)); !errors.Is(err, ErrMeta) {
		t.Errorf("unknown field accepted: %v", err)
	}
}

func TestFileMeta(t *testing.T) {
	f := File{SHA256: strings.Repeat("b", 64), Size: 4096}
	got, ok, err := FileFromMeta(viaJSON(t, f.Meta()))
	if err != nil || !ok || got != f {
		t.Fatalf("round trip = %+v %v %v", got, ok, err)
	}
	if _, _, err := FileFromMeta(map[string]any{KeyFile: map[string]any{"sha256": "x", "size": 1}}); !errors.Is(err, ErrMeta) {
		t.Fatalf("bad digest accepted: %v", err)
	}
}
