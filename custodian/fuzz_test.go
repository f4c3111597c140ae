package custodian

import (
	"path"
	"strings"
	"testing"
)

// FuzzRelPath: whatever the agent sends, an accepted path maps to the root
// or strictly beneath it, and names the same place as the cleaned input.
func FuzzRelPath(f *testing.F) {
	for _, s := range []string{"/srv/w1", "/srv/w1/a/b", "/srv/w1/../x", "/srv/w12/a", "/etc/passwd",
		"/srv/w1/./a//b/", "relative", "", "/srv/w1/a/..", "/srv/w1\x00/a"} {
		f.Add("/srv/w1", s)
	}
	f.Add("/", "/etc/passwd")
	f.Fuzz(func(t *testing.T, root, p string) {
		if root == "" || !path.IsAbs(root) || path.Clean(root) != root {
			return // tuple validation guarantees an absolute clean root
		}
		rel, err := relPath(root, p)
		if err != nil {
			return
		}
		if strings.HasPrefix(rel, "/") || rel == ".." || strings.HasPrefix(rel, "../") || strings.Contains(rel, "\x00") {
			t.Fatalf("relPath(%q, %q) = %q escapes", root, p, rel)
		}
		if got := path.Join(root, rel); got != path.Clean(p) {
			t.Fatalf("relPath(%q, %q) = %q names %q, not %q", root, p, rel, got, path.Clean(p))
		}
		dirOnly := strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.")
		if dirOnly && rel != "." && !strings.HasSuffix(rel, "/") {
			t.Fatalf("relPath(%q, %q) = %q lost the final slash: a directory path became a file name", root, p, rel)
		}
	})
}

// FuzzParseConfig: a config either parses into something Validate accepts
// or is refused; it never panics.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"tuple":{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/w1"},
"lease_not_after":"2030-01-01T00:00:00Z","principal":"alice","state_dir":"state","audit_key_file":"audit.key","receiver":{"kind":"unix","path":"r.sock","host_only":true}}`))
	f.Add([]byte(`{"receiver":{"kind":"tls"},"command_budget":"-1s"}`))
	f.Add([]byte(`{} {}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "/etc/tether")
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config fails Validate: %v", err)
		}
		if c.Principal != c.Tuple.Owner {
			t.Fatal("accepted a principal other than the owner")
		}
		for k := range c.SessionMeta {
			if strings.HasPrefix(k, "tether/") {
				t.Fatalf("accepted session_meta key %q", k)
			}
		}
	})
}
