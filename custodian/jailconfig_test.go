package custodian

import (
	"errors"
	"slices"
	"testing"

	"github.com/tetherdev/tether/custodian/jail"
)

// TestConfigJail: the jail section is decoded strictly, its relative
// paths are taken relative to the config's directory, and a bad network,
// a uid 0, a bad uid range, limits below the minimum or an unknown cgroup
// mode are refused.
func TestConfigJail(t *testing.T) {
	base := `{"tuple":{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/w1"},
"lease_not_after":"2030-01-01T00:00:00Z","principal":"alice","state_dir":"state","audit_key_file":"audit.key",
"receiver":{"kind":"unix","path":"r.sock","host_only":true},"jail":%s}`
	c, err := ParseConfig([]byte(sprintf(base, `{"read":["agent","/opt/x"],"exec":["bin/node"],"network":"none","uid":61000,"gid":61001,`+
		`"uid_range":{"first":50000,"last":50999},"max_memory_bytes":1073741824,"max_pids":256,"cgroup":"off"}`)), "/etc/tether")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Jail.Read, []string{"/etc/tether/agent", "/opt/x"}) || !slices.Equal(c.Jail.Exec, []string{"/etc/tether/bin/node"}) ||
		c.Jail.Network != jail.NetworkNone || *c.Jail.UID != 61000 || *c.Jail.GID != 61001 ||
		*c.Jail.UIDRange != (jail.IDRange{First: 50000, Last: 50999}) || *c.Jail.MaxMemoryBytes != 1<<30 || *c.Jail.MaxPids != 256 ||
		c.Jail.Cgroup != jail.CgroupOff {
		t.Errorf("jail section: %+v", c.Jail)
	}
	for name, j := range map[string]string{
		"network bridge": `{"network":"bridge"}`,
		"uid 0":          `{"uid":0}`,
		"gid 0":          `{"gid":0}`,
		"unknown field":  `{"write":["/"]}`,
		"gid alone":      `{"gid":61001}`,
		"range reversed": `{"uid_range":{"first":2,"last":1}}`,
		"range no last":  `{"uid_range":{"first":2}}`,
		"memory tiny":    `{"max_memory_bytes":4096}`,
		"pids zero":      `{"max_pids":0}`,
		"cgroup auto":    `{"cgroup":"auto"}`,
	} {
		if _, err := ParseConfig([]byte(sprintf(base, j)), "/etc/tether"); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
