package custodian

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// testWitnessVKey returns a cosignature/v1 verifier key for a fresh key.
func testWitnessVKey(name string) string {
	pub, _, _ := ed25519.GenerateKey(nil)
	key := append([]byte{4}, pub...)
	h := sha256.Sum256(append([]byte(name+"\n"), key...))
	return fmt.Sprintf("%s+%08x+%s", name, binary.BigEndian.Uint32(h[:]), base64.StdEncoding.EncodeToString(key))
}

// TestConfigWitnesses: witnesses need https or http to a loopback host,
// a cosignature verifier key each, distinct keys, and a quorum between 1
// and their number (0: all); witness_quorum alone is refused.
func TestConfigWitnesses(t *testing.T) {
	base := `{"tuple":{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/w1"},
"lease_not_after":"2030-01-01T00:00:00Z","principal":"alice","state_dir":"state","audit_key_file":"audit.key",
"receiver":{"kind":"unix","path":"r.sock","host_only":true}%s}`
	k1, k2 := testWitnessVKey("w1.example"), testWitnessVKey("w2.example")
	w := func(url, key string) string { return fmt.Sprintf(`{"url":%q,"vkey":%q}`, url, key) }
	c, err := ParseConfig([]byte(fmt.Sprintf(base, `,"witnesses":[`+w("https://w1.example:7380", k1)+`,`+w("http://127.0.0.1:7380", k2)+`],"witness_quorum":1`)), "/etc/tether")
	if err != nil {
		t.Fatal(err)
	}
	o, err := c.WitnessOptions()
	if err != nil || o == nil || len(o.Witnesses) != 2 || o.Quorum != 1 || o.Witnesses[1].Verifier.Name() != "w2.example" {
		t.Fatalf("WitnessOptions = %+v, %v", o, err)
	}
	if o, err := (&Config{}).WitnessOptions(); o != nil || err != nil {
		t.Fatalf("no witnesses: %+v, %v; want nil, nil", o, err)
	}
	for name, extra := range map[string]string{
		"http to another host":  `,"witnesses":[` + w("http://w1.example:7380", k1) + `]`,
		"other scheme":          `,"witnesses":[` + w("ftp://127.0.0.1", k1) + `]`,
		"bad key":               `,"witnesses":[` + w("https://w1.example", strings.Replace(k1, "+", "-", 1)) + `]`,
		"a log key, not a wit.": `,"witnesses":[` + w("https://w1.example", "w1.example+01234567+AQ==") + `]`,
		"same key twice":        `,"witnesses":[` + w("https://w1.example", k1) + `,` + w("https://w2.example", k1) + `]`,
		"quorum above":          `,"witnesses":[` + w("https://w1.example", k1) + `],"witness_quorum":2`,
		"negative quorum":       `,"witnesses":[` + w("https://w1.example", k1) + `],"witness_quorum":-1`,
		"quorum alone":          `,"witness_quorum":1`,
		"unknown field":         `,"witnesses":[{"url":"https://w1.example","vkey":"` + k1 + `","token":"x"}]`,
	} {
		if _, err := ParseConfig([]byte(fmt.Sprintf(base, extra)), "/etc/tether"); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
