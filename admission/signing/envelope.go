package signing

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/tetherdev/tether/admission/strictjson"
)

// Errors Verify returns; callers branch on them with errors.Is.
var (
	// ErrEnvelope: the bytes are not one strict DSSE envelope (duplicate,
	// unknown or case-folded keys, trailing data, too large, bad base64,
	// too many signatures).
	ErrEnvelope = errors.New("malformed DSSE envelope")
	// ErrPayloadType: the envelope's payload type is not the expected one.
	ErrPayloadType = errors.New("wrong payload type")
	// ErrNoSignature: the envelope carries no signature.
	ErrNoSignature = errors.New("envelope has no signature")
	// ErrSignature: no signature verifies under the pinned key (wrong key,
	// tampered payload or payload type, or a corrupted signature).
	ErrSignature = errors.New("no valid signature by the pinned key")
)

// MaxSignatures bounds the signatures Verify will look at, so a hostile
// envelope cannot make it spend unbounded time.
const MaxSignatures = 8

// MaxEnvelopeBytes bounds the envelope Verify decodes. The admission
// loader's own limit is not larger (signedfile.HardMaxBytes).
const MaxEnvelopeBytes = 64 << 20

// Sign returns the JSON of a DSSE envelope over payload with payloadType,
// holding one ed25519 signature by key whose keyid is key's KeyID.
func Sign(ctx context.Context, payloadType string, payload []byte, key PrivateKey) ([]byte, error) {
	if len(key.key) != ed25519.PrivateKeySize {
		return nil, errors.New("sign: private key is not initialised")
	}
	if payloadType == "" {
		return nil, errors.New("sign: payload type is empty")
	}
	es, err := dsse.NewEnvelopeSigner(signer{key})
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	env, err := es.SignPayload(ctx, payloadType, payload)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	out, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("sign: marshal envelope: %w", err)
	}
	return out, nil
}

// Verify strictly decodes envelopeJSON, requires payloadType, and requires a
// signature that verifies under pub. It returns the signed payload. The
// first failed check is named by the error: ErrEnvelope, ErrPayloadType,
// ErrNoSignature or ErrSignature.
func Verify(ctx context.Context, envelopeJSON []byte, payloadType string, pub PublicKey) ([]byte, error) {
	if len(pub.key) != ed25519.PublicKeySize {
		return nil, errors.New("verify: public key is not initialised")
	}
	env, err := decodeEnvelope(envelopeJSON)
	if err != nil {
		return nil, err
	}
	if env.PayloadType != payloadType {
		return nil, fmt.Errorf("%w: %q, want %q", ErrPayloadType, env.PayloadType, payloadType)
	}
	if len(env.Signatures) == 0 {
		return nil, ErrNoSignature
	}
	ev, err := dsse.NewEnvelopeVerifier(verifier{pub})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	_, payload, err := ev.VerifyAndDecode(ctx, env)
	if err != nil {
		// dsse's own message ("accepted signatures do not match threshold")
		// adds nothing: every signature was either for another key or bad.
		return nil, fmt.Errorf("%w (keyid %s)", ErrSignature, pub.KeyID())
	}
	return payload, nil
}

// decodeEnvelope decodes exactly one envelope with the one strict decoder
// (admission/strictjson): a duplicated "payload" or "signatures" key, which
// another DSSE reader could resolve to the other value, is refused, as are
// unknown fields and trailing data. It checks every base64 field before
// dsse sees it, so that a dsse error can only mean a signature failure.
func decodeEnvelope(data []byte) (*dsse.Envelope, error) {
	var env dsse.Envelope
	if err := strictjson.Decode(data, MaxEnvelopeBytes, &env); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEnvelope, err)
	}
	if len(env.Signatures) > MaxSignatures {
		return nil, fmt.Errorf("%w: %d signatures, at most %d", ErrEnvelope, len(env.Signatures), MaxSignatures)
	}
	if _, err := base64.StdEncoding.DecodeString(env.Payload); err != nil {
		return nil, fmt.Errorf("%w: payload is not standard base64", ErrEnvelope)
	}
	for i, s := range env.Signatures {
		if _, err := base64.StdEncoding.DecodeString(s.Sig); err != nil {
			return nil, fmt.Errorf("%w: signature %d is not standard base64", ErrEnvelope, i)
		}
	}
	return &env, nil
}

// signer adapts PrivateKey to dsse.Signer.
type signer struct{ k PrivateKey }

// Sign signs the PAE bytes with ed25519.
func (s signer) Sign(_ context.Context, data []byte) ([]byte, error) {
	return ed25519.Sign(s.k.key, data), nil
}

// KeyID is the signing key's pinned ID.
func (s signer) KeyID() (string, error) { return s.k.pub.id, nil }

// verifier adapts PublicKey to dsse.Verifier. dsse skips a signature whose
// keyid is set and differs from KeyID.
type verifier struct{ p PublicKey }

var errBadSig = errors.New("ed25519 signature does not verify")

// Verify checks an ed25519 signature over the PAE bytes.
func (v verifier) Verify(_ context.Context, data, sig []byte) error {
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(v.p.key, data, sig) {
		return errBadSig
	}
	return nil
}

// KeyID is the pinned key's ID.
func (v verifier) KeyID() (string, error) { return v.p.id, nil }

// Public returns the pinned key.
func (v verifier) Public() crypto.PublicKey { return v.p.Ed25519() }

var (
	_ dsse.Signer   = signer{}
	_ dsse.Verifier = verifier{}
)
