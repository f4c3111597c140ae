package ctl

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func validIdentity() *Identity {
	return &Identity{Entropy: make([]byte, MinEntropy), MachineID: strings.Repeat("ab", 16), UID: 60001, GID: 60001,
		Files: []IdentityFile{{Path: "/etc/tether/receiver.json", Data: []byte("{}"), Mode: 0o600}}}
}

func identityLine(t *testing.T, op Op, id *Identity) []byte {
	t.Helper()
	b, err := json.Marshal(Request{Op: op, Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeIdentity: a valid identity decodes; each broken member, and
// an identity on another op or an identity op without one, is refused.
func TestDecodeIdentity(t *testing.T) {
	if _, err := DecodeRequest(identityLine(t, OpIdentity, validIdentity())); err != nil {
		t.Fatalf("valid identity refused: %v", err)
	}
	for name, mut := range map[string]func(*Identity){
		"short entropy":    func(id *Identity) { id.Entropy = id.Entropy[:MinEntropy-1] },
		"long entropy":     func(id *Identity) { id.Entropy = make([]byte, MaxEntropy+1) },
		"upper machine id": func(id *Identity) { id.MachineID = strings.Repeat("AB", 16) },
		"short machine id": func(id *Identity) { id.MachineID = "abcd" },
		"root uid":         func(id *Identity) { id.UID = 0 },
		"relative path":    func(id *Identity) { id.Files[0].Path = "etc/x" },
		"unclean path":     func(id *Identity) { id.Files[0].Path = "/etc/../x" },
		"setuid mode":      func(id *Identity) { id.Files[0].Mode = 0o4755 },
	} {
		id := validIdentity()
		mut(id)
		if _, err := DecodeRequest(identityLine(t, OpIdentity, id)); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: err = %v, want ErrProtocol", name, err)
		}
	}
	if _, err := DecodeRequest(identityLine(t, OpStatus, validIdentity())); !errors.Is(err, ErrProtocol) {
		t.Errorf("identity on status: err = %v", err)
	}
	if _, err := DecodeRequest(identityLine(t, OpIdentity, nil)); !errors.Is(err, ErrProtocol) {
		t.Errorf("identity op without one: err = %v", err)
	}
}
