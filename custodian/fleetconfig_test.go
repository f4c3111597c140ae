package custodian

import (
	"errors"
	"testing"
	"time"
)

// TestConfigOpStore: the op_store section is decoded strictly; etcd needs
// endpoints and a name, takes https only with a pinned CA (plain http only
// to a loopback host), a lease of 2 s or more, and a client certificate
// only as a pair, an unavailable wait of 0 (60 s) or more seconds; bbolt
// takes nothing else. Relative certificate paths are
// taken relative to the config's directory.
func TestConfigOpStore(t *testing.T) {
	base := `{"tuple":{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/w1"},
"lease_not_after":"2030-01-01T00:00:00Z","principal":"alice","state_dir":"state","audit_key_file":"audit.key",
"receiver":{"kind":"unix","path":"r.sock","host_only":true},"op_store":%s}`
	c, err := ParseConfig([]byte(sprintf(base, `{"kind":"etcd","endpoints":["https://etcd-1:2379"],"name":"c-a","ca_cert":"ca.pem","cert_file":"c.pem","key_file":"c.key"}`)), "/etc/tether")
	if err != nil {
		t.Fatal(err)
	}
	if o := c.OpStore; !o.Etcd() || o.CACert != "/etc/tether/ca.pem" || o.CertFile != "/etc/tether/c.pem" || o.KeyFile != "/etc/tether/c.key" || o.leaseTTL() != 10*time.Second {
		t.Errorf("op_store section: %+v", o)
	}
	if w := c.OpStore.UnavailableWait(); w != DefaultUnavailableWait {
		t.Errorf("unavailable wait %s by default, want %s", w, DefaultUnavailableWait)
	}
	w, err := ParseConfig([]byte(sprintf(base, `{"kind":"etcd","endpoints":["http://127.0.0.1:2379"],"name":"c-a","unavailable_wait_s":7}`)), "/etc/tether")
	if err != nil || w.OpStore.UnavailableWait() != 7*time.Second {
		t.Errorf("unavailable_wait_s 7: %v", err)
	}
	for _, ok := range []string{
		`{"kind":"bbolt"}`,
		`{"kind":"etcd","endpoints":["http://127.0.0.1:2379","http://localhost:2379","http://[::1]:2379"],"name":"c-a","lease_ttl_s":2}`,
	} {
		if _, err := ParseConfig([]byte(sprintf(base, ok)), "/etc/tether"); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for name, o := range map[string]string{
		"unknown kind":              `{"kind":"postgres"}`,
		"bbolt with endpoints":      `{"kind":"bbolt","endpoints":["http://127.0.0.1:2379"]}`,
		"no endpoints":              `{"kind":"etcd","name":"c-a"}`,
		"no name":                   `{"kind":"etcd","endpoints":["http://127.0.0.1:2379"]}`,
		"http to another host":      `{"kind":"etcd","endpoints":["http://etcd-1:2379"],"name":"c-a"}`,
		"http to a routable ip":     `{"kind":"etcd","endpoints":["http://10.0.0.1:2379"],"name":"c-a"}`,
		"https without a pinned ca": `{"kind":"etcd","endpoints":["https://etcd-1:2379"],"name":"c-a"}`,
		"other scheme":              `{"kind":"etcd","endpoints":["unix:///run/etcd.sock"],"name":"c-a"}`,
		"endpoint with a path":      `{"kind":"etcd","endpoints":["http://127.0.0.1:2379/x"],"name":"c-a"}`,
		"lease of 1 s":              `{"kind":"etcd","endpoints":["http://127.0.0.1:2379"],"name":"c-a","lease_ttl_s":1}`,
		"negative lease":            `{"kind":"etcd","endpoints":["http://127.0.0.1:2379"],"name":"c-a","lease_ttl_s":-5}`,
		"negative unavailable wait": `{"kind":"etcd","endpoints":["http://127.0.0.1:2379"],"name":"c-a","unavailable_wait_s":-1}`,
		"bbolt with a wait":         `{"kind":"bbolt","unavailable_wait_s":5}`,
		"cert without key":          `{"kind":"etcd","endpoints":["https://etcd-1:2379"],"name":"c-a","ca_cert":"ca.pem","cert_file":"c.pem"}`,
		"client cert without ca":    `{"kind":"etcd","endpoints":["http://127.0.0.1:2379"],"name":"c-a","cert_file":"c.pem","key_file":"c.key"}`,
		"unknown field":             `{"kind":"etcd","endpoints":["http://127.0.0.1:2379"],"name":"c-a","password":"x"}`,
	} {
		if _, err := ParseConfig([]byte(sprintf(base, o)), "/etc/tether"); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
