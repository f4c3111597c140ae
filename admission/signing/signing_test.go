package signing

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherdev/tether/fixtures/testenv"
)

const testType = "application/vnd.tether.test+json"

func mustKey(t testing.TB) PrivateKey {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustSign(t testing.TB, payload string, k PrivateKey) []byte {
	t.Helper()
	env, err := Sign(context.Background(), testType, []byte(payload), k)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// envelope is an independent view of the JSON, used to tamper with it.
type envelope struct {
	PayloadType string `json:"payloadType"`
	Payload     string `json:"payload"`
	Signatures  []struct {
		KeyID string `json:"keyid"`
		Sig   string `json:"sig"`
	} `json:"signatures"`
}

func edit(t *testing.T, env []byte, f func(*envelope)) []byte {
	t.Helper()
	var e envelope
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	f(&e)
	out, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSignMatchesDSSEProtocolByHand(t *testing.T) {
	k := mustKey(t)
	payload := `{"generation":1}`
	env := mustSign(t, payload, k)
	var e envelope
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	// PAE per the DSSE spec, built here without the library.
	pae := fmt.Sprintf("DSSEv1 %d %s %d %s", len(testType), testType, len(payload), payload)
	want := base64.StdEncoding.EncodeToString(ed25519.Sign(k.key, []byte(pae)))
	if e.PayloadType != testType || e.Payload != base64.StdEncoding.EncodeToString([]byte(payload)) {
		t.Fatalf("envelope header = %+v", e)
	}
	if len(e.Signatures) != 1 || e.Signatures[0].Sig != want || e.Signatures[0].KeyID != k.Public().KeyID() {
		t.Fatalf("signatures = %+v, want one sig %s with keyid %s", e.Signatures, want, k.Public().KeyID())
	}
	got, err := Verify(context.Background(), env, testType, k.Public())
	if err != nil || string(got) != payload {
		t.Fatalf("Verify = %q, %v", got, err)
	}
}

func TestKeyIDIsSHA256OfPKIX(t *testing.T) {
	k := mustKey(t)
	der, err := x509.MarshalPKIXPublicKey(k.key.Public())
	if err != nil {
		t.Fatal(err)
	}
	// Independent of NewPublicKey: sha256sum of the DER.
	if got, want := k.Public().KeyID(), fmt.Sprintf("%x", sha256Sum(der)); got != want {
		t.Fatalf("KeyID = %s, want %s", got, want)
	}
	if other := mustKey(t); other.Public().KeyID() == k.Public().KeyID() {
		t.Fatal("two keys share a KeyID")
	}
}

func TestVerifyRefuses(t *testing.T) {
	ctx := context.Background()
	k, other := mustKey(t), mustKey(t)
	env := mustSign(t, `{"generation":7}`, k)
	otherSigned := mustSign(t, `{"generation":7}`, other)
	cases := []struct {
		name string
		env  []byte
		typ  string
		want error
	}{
		{"wrong payload type expected", env, "application/other", ErrPayloadType},
		{"payload type relabelled", edit(t, env, func(e *envelope) { e.PayloadType = "application/other" }), "application/other", ErrSignature},
		{"no signature", edit(t, env, func(e *envelope) { e.Signatures = nil }), testType, ErrNoSignature},
		{"wrong key", otherSigned, testType, ErrSignature},
		{"wrong key with pinned keyid", edit(t, otherSigned, func(e *envelope) { e.Signatures[0].KeyID = k.Public().KeyID() }), testType, ErrSignature},
		{"right sig, other keyid", edit(t, env, func(e *envelope) { e.Signatures[0].KeyID = other.Public().KeyID() }), testType, ErrSignature},
		{"tampered payload", edit(t, env, func(e *envelope) {
			e.Payload = base64.StdEncoding.EncodeToString([]byte(`{"generation":8}`))
		}), testType, ErrSignature},
		{"truncated sig", edit(t, env, func(e *envelope) {
			e.Signatures[0].Sig = base64.StdEncoding.EncodeToString(make([]byte, 63))
		}), testType, ErrSignature},
		{"unknown field", []byte(strings.Replace(string(env), `"payload":`, `"extra":1,"payload":`, 1)), testType, ErrEnvelope},
		{"trailing data", append(append([]byte{}, env...), []byte(` {}`)...), testType, ErrEnvelope},
		{"trailing bracket", append(append([]byte{}, env...), ']'), testType, ErrEnvelope},
		{"bad payload base64", edit(t, env, func(e *envelope) { e.Payload = "!!" }), testType, ErrEnvelope},
		{"url base64 sig", edit(t, env, func(e *envelope) { e.Signatures[0].Sig = "-_-_" }), testType, ErrEnvelope},
		{"too many signatures", edit(t, env, func(e *envelope) {
			for len(e.Signatures) <= MaxSignatures {
				e.Signatures = append(e.Signatures, e.Signatures[0])
			}
		}), testType, ErrEnvelope},
		{"not json", []byte("not json"), testType, ErrEnvelope},
	}
	for _, c := range cases {
		payload, err := Verify(ctx, c.env, c.typ, k.Public())
		if !errors.Is(err, c.want) || payload != nil {
			t.Errorf("%s: Verify = %q, %v; want %v", c.name, payload, err, c.want)
		}
	}
}

func TestVerifyAcceptsPinnedAmongOthers(t *testing.T) {
	k, other := mustKey(t), mustKey(t)
	env := mustSign(t, `{}`, k)
	var e envelope
	json.Unmarshal(mustSign(t, `{}`, other), &e)
	mixed := edit(t, env, func(x *envelope) { x.Signatures = append(e.Signatures, x.Signatures...) })
	if _, err := Verify(context.Background(), mixed, testType, k.Public()); err != nil {
		t.Fatalf("envelope with a foreign signature first and the pinned one second: %v", err)
	}
}

func TestKeyFilesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	old := syscall.Umask(0) // the private key must still be 0600
	defer syscall.Umask(old)
	k := mustKey(t)
	priv, pub := filepath.Join(dir, "k.key"), filepath.Join(dir, "k.pub")
	if err := WritePrivateKey(priv, k); err != nil {
		t.Fatal(err)
	}
	if err := WritePublicKey(pub, k.Public()); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(priv); fi.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode %04o, want 0600", fi.Mode().Perm())
	}
	k2, err := LoadPrivateKey(priv)
	if err != nil || !k2.Public().Equal(k.Public()) {
		t.Fatalf("LoadPrivateKey = %v", err)
	}
	p2, err := LoadPublicKey(pub)
	if err != nil || p2.KeyID() != k.Public().KeyID() {
		t.Fatalf("LoadPublicKey = %v", err)
	}
	if err := WritePrivateKey(priv, mustKey(t)); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("overwrite of an existing key: %v, want ErrKeyFile", err)
	}
	if again, _ := LoadPrivateKey(priv); !again.Public().Equal(k.Public()) {
		t.Fatal("existing key was clobbered")
	}
}

func TestLoadPrivateKeyRefuses(t *testing.T) {
	dir := t.TempDir()
	k := mustKey(t)
	good := filepath.Join(dir, "good.key")
	if err := WritePrivateKey(good, k); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o644, 0o610, 0o601, 0o660} {
		p := filepath.Join(dir, fmt.Sprintf("m%o.key", mode))
		os.WriteFile(p, k.MarshalPEM(), 0o600)
		os.Chmod(p, mode)
		var pe *KeyPermError
		if _, err := LoadPrivateKey(p); !errors.As(err, &pe) || !errors.Is(err, ErrKeyPermissions) {
			t.Errorf("mode %04o: err = %v, want *KeyPermError", mode, err)
		}
	}
	link := filepath.Join(dir, "link.key")
	os.Symlink(good, link)
	if _, err := LoadPrivateKey(link); !errors.Is(err, ErrKeyFile) {
		t.Errorf("symlink: err = %v, want ErrKeyFile", err)
	}
	fifo := filepath.Join(dir, "fifo.key")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPrivateKey(fifo); !errors.Is(err, ErrKeyFile) {
		t.Errorf("fifo: err = %v, want ErrKeyFile", err)
	}
	if _, err := LoadPrivateKey(dir); !errors.Is(err, ErrKeyFile) {
		t.Errorf("directory: err = %v, want ErrKeyFile", err)
	}
	pubAsPriv := filepath.Join(dir, "pub-as.key")
	os.WriteFile(pubAsPriv, k.Public().MarshalPEM(), 0o600)
	if _, err := LoadPrivateKey(pubAsPriv); !errors.Is(err, ErrKeyEncoding) {
		t.Errorf("public key in private key file: err = %v, want ErrKeyEncoding", err)
	}
}

func TestLoadPrivateKeyRefusesOtherOwner(t *testing.T) {
	testenv.Require(t, "root")
	p := filepath.Join(t.TempDir(), "owned.key")
	if err := WritePrivateKey(p, mustKey(t)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 60001, 60001); err != nil {
		t.Fatal(err)
	}
	var pe *KeyPermError
	if _, err := LoadPrivateKey(p); !errors.As(err, &pe) || pe.UID != 60001 {
		t.Fatalf("key owned by uid 60001 loaded by uid %d: err = %v, want *KeyPermError", os.Geteuid(), err)
	}
}

func TestLoadPublicKeyRefuses(t *testing.T) {
	dir := t.TempDir()
	k := mustKey(t)
	for _, mode := range []os.FileMode{0o664, 0o646, 0o666} {
		p := filepath.Join(dir, fmt.Sprintf("m%o.pub", mode))
		os.WriteFile(p, k.Public().MarshalPEM(), 0o644)
		os.Chmod(p, mode)
		if _, err := LoadPublicKey(p); !errors.Is(err, ErrKeyPermissions) {
			t.Errorf("mode %04o: err = %v, want ErrKeyPermissions", mode, err)
		}
	}
	good := filepath.Join(dir, "good.pub")
	WritePublicKey(good, k.Public())
	link := filepath.Join(dir, "link.pub")
	os.Symlink(good, link)
	if _, err := LoadPublicKey(link); !errors.Is(err, ErrKeyFile) {
		t.Errorf("symlink: err = %v, want ErrKeyFile", err)
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	bad := map[string][]byte{
		"ecdsa key":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}),
		"private block": k.MarshalPEM(),
		"trailing":      append(k.Public().MarshalPEM(), []byte("junk")...),
		"headers":       pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Headers: map[string]string{"a": "b"}, Bytes: der}),
		"empty":         nil,
		"huge":          []byte(strings.Repeat(" ", maxKeyFile+1)),
	}
	for name, data := range bad {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".pub")
		os.WriteFile(p, data, 0o644)
		if _, err := LoadPublicKey(p); !errors.Is(err, ErrKeyEncoding) {
			t.Errorf("%s: err = %v, want ErrKeyEncoding", name, err)
		}
	}
}

// FuzzVerify feeds arbitrary envelopes to Verify: it must never panic, and
// whatever it accepts must carry a real signature by the pinned key over
// the returned payload.
func FuzzVerify(f *testing.F) {
	seed := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	k := newPrivateKey(seed)
	env, err := Sign(context.Background(), testType, []byte(`{"generation":1}`), k)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(env)
	f.Fuzz(func(t *testing.T, data []byte) {
		payload, err := Verify(context.Background(), data, testType, k.Public())
		if err != nil {
			return
		}
		pae := fmt.Sprintf("DSSEv1 %d %s %d %s", len(testType), testType, len(payload), payload)
		var e envelope
		if json.Unmarshal(data, &e) != nil {
			t.Fatalf("accepted an envelope that is not JSON: %q", data)
		}
		for _, s := range e.Signatures {
			sig, _ := base64.StdEncoding.DecodeString(s.Sig)
			if ed25519.Verify(k.Public().key, []byte(pae), sig) {
				return
			}
		}
		t.Fatalf("accepted %q without a valid signature", data)
	})
}

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }
