package toolplan

import (
	"errors"
	"path"
	"strings"
	"testing"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
)

func TestResolve(t *testing.T) {
	for _, c := range []struct{ root, in, want, code string }{
		{"/srv/ws", "a/b.txt", "/srv/ws/a/b.txt", ""},
		{"/srv/ws", "/srv/ws/x", "/srv/ws/x", ""},
		{"/srv/ws", ".", "/srv/ws", ""},
		{"/srv/ws", "../ws2/x", "", "path_escape"},
		{"/srv/ws", "/srv/ws2", "", "path_escape"},
		{"/srv/ws", "a/../../etc", "", "path_escape"},
		{"/srv/ws", "", "", "invalid"},
		{"/srv/ws", "a\x00b", "", "invalid"},
		{"/", "etc/x", "/etc/x", ""},
	} {
		got, err := Resolve(c.root, c.in)
		code, _ := acperr.CodeOf(err)
		if got != c.want || string(code) != c.code {
			t.Errorf("Resolve(%q, %q) = %q, %v; want %q, %q", c.root, c.in, got, err, c.want, c.code)
		}
	}
}

// FuzzResolve: whatever the input, an accepted path is clean, absolute and
// the root or below it.
func FuzzResolve(f *testing.F) {
	f.Fuzz(func(t *testing.T, p string) {
		const root = "/srv/ws"
		got, err := Resolve(root, p)
		if err != nil {
			var we *errcode.Error
			if !errors.As(err, &we) || (we.Code != errcode.CodePathEscape && we.Code != errcode.CodeInvalid) {
				t.Fatalf("Resolve(%q): untyped error %v", p, err)
			}
			return
		}
		if got != path.Clean(got) || (got != root && !strings.HasPrefix(got, root+"/")) {
			t.Fatalf("Resolve(%q) = %q escapes %s", p, got, root)
		}
	})
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pat, name string
		want      bool
	}{
		{"*.txt", "a.txt", true},
		{"*.txt", "d/a.txt", false},
		{"**/*.txt", "a.txt", true},
		{"**/*.txt", "d/e/a.txt", true},
		{"d/**", "d/e/f", true},
		{"d/**/f", "d/f", true},
		{"d/*/f", "d/f", false},
		{"[", "[", false},
		{"/abs", "abs", false},
		{"a/../b", "b", false},
	} {
		if got := Match(c.pat, c.name); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pat, c.name, got, c.want)
		}
	}
	if ValidPattern("**/**/**/**/**/x") == nil {
		t.Error("five ** segments accepted")
	}
}

// FuzzMatch: Match never panics, agrees with path.Match on patterns
// without "**", and "**" alone matches every non-empty path.
func FuzzMatch(f *testing.F) {
	f.Fuzz(func(t *testing.T, pat, name string) {
		got := Match(pat, name)
		if ValidPattern(pat) != nil {
			if got {
				t.Fatalf("invalid pattern %q matched %q", pat, name)
			}
			return
		}
		if !strings.Contains(pat, "**") && name != "" {
			segsP, segsN := strings.Split(pat, "/"), strings.Split(name, "/")
			want := len(segsP) == len(segsN)
			for i := 0; want && i < len(segsP); i++ {
				ok, _ := path.Match(segsP[i], segsN[i])
				want = ok
			}
			if got != want {
				t.Fatalf("Match(%q, %q) = %v, segment-wise path.Match says %v", pat, name, got, want)
			}
		}
		if name != "" && !Match("**", name) {
			t.Fatalf("** did not match %q", name)
		}
	})
}

func TestParseListing(t *testing.T) {
	es, err := ParseListing("file/b.txt\x00dir/a\x00symlink/l\x00other/p\x00")
	if err != nil || len(es) != 4 || es[0].Name != "a" || es[0].Type != "dir" {
		t.Fatalf("ParseListing = %v, %v", es, err)
	}
	for _, bad := range []string{"file\x00", "weird/x\x00", "file/a/b\x00", "dir/\x00"} {
		if _, err := ParseListing(bad); err == nil {
			t.Errorf("ParseListing(%q) accepted", bad)
		}
	}
}

// FuzzParseListing: an accepted listing has only known types and names
// without a slash.
func FuzzParseListing(f *testing.F) {
	f.Fuzz(func(t *testing.T, out string) {
		es, err := ParseListing(out)
		if err != nil {
			return
		}
		for _, e := range es {
			if e.Name == "" || strings.Contains(e.Name, "/") || (e.Type != "dir" && e.Type != "file" && e.Type != "symlink" && e.Type != "other") {
				t.Fatalf("accepted entry %+v from %q", e, out)
			}
		}
	})
}

func TestParseGrep(t *testing.T) {
	ms, err := ParseGrep("/r", "./a.txt:3:hello: world\n./d/b:c.txt:10:x\n")
	if err != nil || len(ms) != 2 || ms[0].Path != "/r/a.txt" || ms[0].Line != 3 || ms[0].Text != "hello: world" ||
		ms[1].Path != "/r/d/b:c.txt" || ms[1].Line != 10 {
		t.Fatalf("ParseGrep = %+v, %v", ms, err)
	}
	if _, err := ParseGrep("/r", "no prefix:1:x\n"); err == nil {
		t.Fatal("line without ./ accepted")
	}
}

// FuzzParseGrep: accepted matches lie below the directory with a line > 0.
func FuzzParseGrep(f *testing.F) {
	f.Fuzz(func(t *testing.T, out string) {
		ms, err := ParseGrep("/r", out)
		if err != nil {
			return
		}
		for _, m := range ms {
			if m.Line < 1 || !strings.HasPrefix(m.Path, "/r") {
				t.Fatalf("accepted %+v from %q", m, out)
			}
		}
	})
}

func TestOpKey(t *testing.T) {
	k, err := OpKey("")
	if err != nil || !acpmeta.ValidOpKey(k+":release") {
		t.Fatalf("fresh key %q: %v", k, err)
	}
	k2, _ := OpKey("")
	if k == k2 {
		t.Fatal("fresh keys repeat")
	}
	if _, err := OpKey(strings.Repeat("a", MaxCallerOpKey+1)); err == nil {
		t.Fatal("over-long caller key accepted")
	}
	if k, err := OpKey("caller.key-1"); err != nil || k != "caller.key-1" {
		t.Fatalf("caller key: %q %v", k, err)
	}
}

// FuzzVerify: an accepted verify request names at most MaxVerifyFiles
// clean relative paths inside the root, each with a lowercase hex SHA-256,
// and passes the custodian's own check; a refusal is a typed error.
func FuzzVerify(f *testing.F) {
	f.Fuzz(func(t *testing.T, p1, d1, p2, d2 string) {
		c := Call{Root: "/srv/ws"}
		m, err := c.verifyMeta(map[string]string{p1: d1, p2: d2})
		if err != nil {
			var we *errcode.Error
			if !errors.As(err, &we) || (we.Code != errcode.CodeInvalid && we.Code != errcode.CodePathEscape) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		v, ok, err := acpmeta.VerifyFromMeta(m.ACP())
		if !ok || err != nil {
			t.Fatalf("accepted %q/%q %q/%q but the custodian refuses it: %v", p1, d1, p2, d2, err)
		}
		for p, d := range v.Files {
			if path.IsAbs(p) || path.Clean(p) != p || strings.HasPrefix(p, "..") || !acpmeta.ValidDigest(d) {
				t.Fatalf("accepted %q: %q", p, d)
			}
		}
	})
}
