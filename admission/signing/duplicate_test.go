package signing

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/tetherdev/tether/admission/strictjson"
)

// TestVerifyRefusesDuplicateKeys: an envelope that names "payload",
// "payloadType", "signatures" or a signature's "sig" twice is refused
// (ErrEnvelope, by the duplicate-key check), whichever of the two values
// is the signed one. For each pair the test first shows that the two
// readings really differ (the envelope holding only the first value and
// the one holding only the last do not verify alike), so a reader that
// keeps the first value and one that keeps the last (encoding/json) would
// disagree; with the duplicate refused, no reading is verified at all.
func TestVerifyRefusesDuplicateKeys(t *testing.T) {
	ctx := context.Background()
	k := mustKey(t)
	var e envelope
	if err := json.Unmarshal(mustSign(t, `{"generation":7}`, k), &e); err != nil {
		t.Fatal(err)
	}
	sigs, _ := json.Marshal(e.Signatures)
	sig := e.Signatures[0]
	forged := base64.StdEncoding.EncodeToString([]byte(`{"generation":8}`))
	badSig := base64.StdEncoding.EncodeToString(make([]byte, 64))
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	env := func(typ, payload, signatures string) string {
		return fmt.Sprintf(`{"payloadType":%s,"payload":%s,"signatures":%s}`, typ, payload, signatures)
	}
	sigObj := func(s string) string { return fmt.Sprintf(`[{"keyid":%s,"sig":%s}]`, q(sig.KeyID), s) }
	cases := []struct {
		name          string
		signed, other string
		twice         func(first, last string) string // the envelope naming the key twice
		once          func(v string) string           // the envelope naming it once
	}{
		{"payload", q(e.Payload), q(forged),
			func(a, b string) string {
				return fmt.Sprintf(`{"payloadType":%s,"payload":%s,"signatures":%s,"payload":%s}`, q(testType), a, sigs, b)
			},
			func(v string) string { return env(q(testType), v, string(sigs)) }},
		{"payload, escaped key", q(e.Payload), q(forged),
			func(a, b string) string {
				return fmt.Sprintf(`{"payloadType":%s,"payload":%s,"signatures":%s,"p\u0061yload":%s}`, q(testType), a, sigs, b)
			},
			func(v string) string { return env(q(testType), v, string(sigs)) }},
		{"signatures", string(sigs), `[]`,
			func(a, b string) string {
				return fmt.Sprintf(`{"payloadType":%s,"signatures":%s,"payload":%s,"signatures":%s}`, q(testType), a, q(e.Payload), b)
			},
			func(v string) string { return env(q(testType), q(e.Payload), v) }},
		{"payloadType", q(testType), q("application/other"),
			func(a, b string) string {
				return fmt.Sprintf(`{"payloadType":%s,"payload":%s,"signatures":%s,"payloadType":%s}`, a, q(e.Payload), sigs, b)
			},
			func(v string) string { return env(v, q(e.Payload), string(sigs)) }},
		{"sig", q(sig.Sig), q(badSig),
			func(a, b string) string {
				return env(q(testType), q(e.Payload), fmt.Sprintf(`[{"keyid":%s,"sig":%s,"sig":%s}]`, q(sig.KeyID), a, b))
			},
			func(v string) string { return env(q(testType), q(e.Payload), sigObj(v)) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errSigned := Verify(ctx, []byte(c.once(c.signed)), testType, k.Public())
			_, errOther := Verify(ctx, []byte(c.once(c.other)), testType, k.Public())
			if errSigned != nil || errOther == nil {
				t.Fatalf("the two readings do not differ: signed value %v, other value %v", errSigned, errOther)
			}
			for _, order := range [][2]string{{c.signed, c.other}, {c.other, c.signed}} {
				doc := c.twice(order[0], order[1])
				payload, err := Verify(ctx, []byte(doc), testType, k.Public())
				if payload != nil || !errors.Is(err, ErrEnvelope) || !errors.Is(err, strictjson.ErrDuplicateKey) {
					t.Errorf("%s: Verify = %q, %v; want ErrEnvelope by the duplicate-key check", doc, payload, err)
				}
			}
		})
	}
}
