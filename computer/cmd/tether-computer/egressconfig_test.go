package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "egress.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoadEgressConfig: a full configuration loads; the empty one takes
// every default (the log in the state directory); each malformed or
// unsafe one is refused with the failed check named.
func TestLoadEgressConfig(t *testing.T) {
	full := `{"presets":[{"name":"pypi","allow":[{"host":"pypi.org"}]},{"name":"mirror","allow":[{"host":"mirror.internal"}],"allow_cidrs":["10.20.0.0/16"]}],
		"dns":"192.0.2.53:53","limits":{"conns":64,"bytes_per_second":1048576,"total_bytes":-1},"log":"/var/log/egress.log",
		"header_timeout_s":5,"dial_timeout_s":3}`
	c, err := loadEgressConfig(writeConfig(t, full, 0o600), "/state")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.presetNames(), []string{"pypi", "mirror"}) || c.DNS != "192.0.2.53:53" || c.Limits.Conns != 64 ||
		c.Limits.TotalBytes != -1 || c.Log != "/var/log/egress.log" || c.HeaderTimeoutS != 5 {
		t.Fatalf("loaded %+v", c)
	}
	c, err = loadEgressConfig(writeConfig(t, `{}`, 0o644), "/state")
	if err != nil || c.Log != "/state/"+EgressLogFile || len(c.Presets) != 0 {
		t.Fatalf("empty config: %+v, %v", c, err)
	}
	bad := map[string]struct {
		body string
		mode os.FileMode
		want string
	}{
		"group writable":   {`{}`, 0o664, "writable by its owner only"},
		"unknown field":    {`{"upstream":"x"}`, 0o600, "upstream"},
		"duplicate key":    {`{"dns":"192.0.2.1:53","dns":"192.0.2.2:53"}`, 0o600, "dns"},
		"preset twice":     {`{"presets":[{"name":"a"},{"name":"a"}]}`, 0o600, `preset "a" twice`},
		"bad preset":       {`{"presets":[{"name":"a","allow_cidrs":["10.0.0.0/99"]}]}`, 0o600, "presets[0]"},
		"dns name":         {`{"dns":"dns.example:53"}`, 0o600, "dns"},
		"dns no port":      {`{"dns":"192.0.2.53"}`, 0o600, "dns"},
		"relative log":     {`{"log":"egress.log"}`, 0o600, "not absolute"},
		"negative conns":   {`{"limits":{"conns":-2}}`, 0o600, "limits.conns"},
		"no timeout limit": {`{"dial_timeout_s":-1}`, 0o600, "dial_timeout_s"},
	}
	for name, k := range bad {
		_, err := loadEgressConfig(writeConfig(t, k.body, k.mode), "/state")
		if err == nil || !strings.Contains(err.Error(), k.want) {
			t.Errorf("%s: %v, want an error naming %q", name, err, k.want)
		}
	}
}
