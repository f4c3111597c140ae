package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// CosignedFile holds the latest checkpoint witnesses cosigned: the log's
// own signature followed by the witnesses' cosignatures.
const CosignedFile = "checkpoint.cosigned"

// Errors of witnessing; callers branch on them with errors.Is.
var (
	// ErrWitnessQuorum: fewer than the required witnesses cosigned.
	ErrWitnessQuorum = errors.New("audit: not enough witness cosignatures")
	// ErrWitnessKey: a witness verifier key does not parse.
	ErrWitnessKey = errors.New("audit: witness key")
)

// algCosignatureV1 is c2sp.org/tlog-cosignature's key algorithm byte.
const algCosignatureV1 = 4

// cosigVerifier verifies a c2sp.org/tlog-cosignature (cosignature/v1):
// the signature is an 8-byte big-endian timestamp followed by an Ed25519
// signature of "cosignature/v1\ntime T\n" + the checkpoint. (torchwood
// v0.6.1 signs these but builds a verifier only from a private key.)
type cosigVerifier struct {
	name string
	hash uint32
	pub  ed25519.PublicKey
}

func (v *cosigVerifier) Name() string    { return v.name }
func (v *cosigVerifier) KeyHash() uint32 { return v.hash }
func (v *cosigVerifier) Verify(msg, sig []byte) bool {
	if len(sig) != 8+ed25519.SignatureSize {
		return false
	}
	t := binary.BigEndian.Uint64(sig)
	m := append([]byte(fmt.Sprintf("cosignature/v1\ntime %d\n", t)), msg...)
	return ed25519.Verify(v.pub, m, sig[8:])
}

// LoadWitnessKey parses a witness's cosignature verifier key:
// name+hash+base64(0x04 || Ed25519 public key).
func LoadWitnessKey(vkey string) (note.Verifier, error) {
	parts := strings.SplitN(strings.TrimSpace(vkey), "+", 3)
	if len(parts) != 3 || parts[0] == "" || len(parts[1]) != 8 {
		return nil, fmt.Errorf("%w: %q is not name+hash+key", ErrWitnessKey, vkey)
	}
	hash, err1 := strconv.ParseUint(parts[1], 16, 32)
	key, err2 := base64.StdEncoding.DecodeString(parts[2])
	if err1 != nil || err2 != nil || len(key) != 1+ed25519.PublicKeySize || key[0] != algCosignatureV1 {
		return nil, fmt.Errorf("%w: %q is not a cosignature/v1 Ed25519 key", ErrWitnessKey, vkey)
	}
	h := sha256.Sum256(append([]byte(parts[0]+"\n"), key...))
	if uint32(hash) != binary.BigEndian.Uint32(h[:]) {
		return nil, fmt.Errorf("%w: %q: key hash does not match", ErrWitnessKey, vkey)
	}
	return &cosigVerifier{name: parts[0], hash: uint32(hash), pub: ed25519.PublicKey(key[1:])}, nil
}

// Witness is one witness: where it listens and its verifier key.
type Witness struct {
	URL      string
	Verifier note.Verifier
}

// Cosign sends the log's current checkpoint (in dir, signed by v) to each
// witness over the C2SP tlog-witness protocol (POST /add-checkpoint with
// a consistency proof from the size the witness last saw, learned from
// its 409 answer), and writes CosignedFile with every cosignature
// obtained if at least quorum witnesses cosigned. A witness that refuses
// (a rewritten or truncated log) adds nothing. It returns the names of
// the witnesses that cosigned. CosignRound is the same exchange with
// each witness's own outcome.
func Cosign(ctx context.Context, dir string, v note.Verifier, ws []Witness, quorum int, hc *http.Client) ([]string, error) {
	res, err := CosignRound(ctx, dir, v, ws, quorum, hc)
	return res.Cosigned, err
}

// CosignResult is what one CosignRound obtained.
type CosignResult struct {
	// Size is the size of the checkpoint sent (0 if none was read).
	Size int64
	// Cosigned names the witnesses that cosigned, in the order given.
	Cosigned []string
	// Errs holds each witness's failure, at its index in the witnesses
	// given; nil where it cosigned.
	Errs []error
	// Written reports that CosignedFile now holds this checkpoint.
	Written bool
}

// CosignRound does what Cosign does, asking the witnesses in parallel,
// and reports each witness's outcome. The error is ErrWitnessQuorum
// (wrapping every witness's failure) when fewer than quorum cosigned,
// or why the checkpoint could not be read, checked or written.
func CosignRound(ctx context.Context, dir string, v note.Verifier, ws []Witness, quorum int, hc *http.Client) (CosignResult, error) {
	msg, t, ck, err := loadCheckpointed(dir, v)
	if err != nil {
		return CosignResult{}, err
	}
	res := CosignResult{Size: ck.Size, Errs: make([]error, len(ws))}
	sigs := make([][]byte, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			sig, werr := addCheckpoint(ctx, hc, w, t, ck, msg)
			if werr != nil {
				res.Errs[i] = fmt.Errorf("witness %s: %w", w.Verifier.Name(), werr)
			}
			sigs[i] = sig
		})
	}
	wg.Wait()
	out := msg
	for i, w := range ws {
		if res.Errs[i] == nil {
			out, res.Cosigned = append(out, sigs[i]...), append(res.Cosigned, w.Verifier.Name())
		}
	}
	if len(res.Cosigned) < quorum {
		return res, fmt.Errorf("%w: %d of %d cosigned, %d required: %w", ErrWitnessQuorum, len(res.Cosigned), len(ws), quorum, errors.Join(res.Errs...))
	}
	if err := writeFileAtomic(dir, CosignedFile, out); err != nil {
		return res, fmt.Errorf("audit cosign: %w", err)
	}
	res.Written = true
	return res, nil
}

// loadCheckpointed reads the log's checkpoint in dir, checks it with v
// and proves the log on disk holds the tree it signs.
func loadCheckpointed(dir string, v note.Verifier) ([]byte, *tree, Checkpoint, error) {
	msg, err := os.ReadFile(filepath.Join(dir, CheckpointFile))
	if err != nil {
		return nil, nil, Checkpoint{}, fmt.Errorf("audit cosign: read checkpoint: %w", err)
	}
	ck, err := OpenCheckpoint(msg, v)
	if err != nil {
		return nil, nil, Checkpoint{}, fmt.Errorf("audit cosign: %w", err)
	}
	t, _, err := loadForVerify(dir)
	if err == nil {
		err = checkSigned(t, ck)
	}
	if err != nil {
		return nil, nil, Checkpoint{}, err
	}
	return msg, t, ck, nil
}

// addCheckpoint submits ck to w, first claiming old size 0 and then the
// size the witness answers with, and returns its verified cosignature
// line.
func addCheckpoint(ctx context.Context, hc *http.Client, w Witness, t *tree, ck Checkpoint, msg []byte) ([]byte, error) {
	old := int64(0)
	for attempt := 0; attempt < 2; attempt++ {
		body, err := requestBody(t, old, ck.Size, msg)
		if err != nil {
			return nil, err
		}
		status, resp, err := post(ctx, hc, w.URL+"/add-checkpoint", body)
		if err != nil {
			return nil, err
		}
		switch {
		case status == http.StatusOK:
			return checkCosignature(msg, resp, w.Verifier)
		case status == http.StatusConflict && attempt == 0:
			if old, err = strconv.ParseInt(strings.TrimSpace(string(resp)), 10, 64); err != nil || old < 0 || old > ck.Size {
				return nil, fmt.Errorf("witness knows size %q, this log has %d: refused (truncated or rewritten?)", resp, ck.Size)
			}
		default:
			return nil, fmt.Errorf("refused (%d): %s", status, bytes.TrimSpace(resp))
		}
	}
	return nil, errors.New("witness keeps answering 409: its size and this log's do not agree")
}

func requestBody(t *tree, old, size int64, msg []byte) ([]byte, error) {
	b := fmt.Appendf(nil, "old %d\n", old)
	if old > 0 && old < size {
		p, err := tlog.ProveTree(size, old, t)
		if err != nil {
			return nil, fmt.Errorf("consistency proof %d..%d: %w", old, size, err)
		}
		for _, h := range p {
			b = append(b, base64.StdEncoding.EncodeToString(h[:])+"\n"...)
		}
	}
	b = append(b, '\n')
	return append(b, msg...), nil
}

func post(ctx context.Context, hc *http.Client, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, data, err
}

// checkCosignature keeps the witness's answer only if it is a valid
// cosignature by w on msg's checkpoint.
func checkCosignature(msg, sigs []byte, w note.Verifier) ([]byte, error) {
	n, err := note.Open(append(append([]byte(nil), msg...), sigs...), note.VerifierList(w))
	if err != nil || len(n.Sigs) != 1 {
		return nil, fmt.Errorf("answer is not one valid cosignature: %v", err)
	}
	return sigs, nil
}

// CheckWitnessed verifies the log in dir against its cosigned checkpoint:
// signed by the log's key v, cosigned by at least quorum of the witnesses
// (distinct keys), and the log still holds exactly the tree the witnesses
// saw (no record edited, none removed), and the log's own checkpoint is
// consistent with it. A missing cosigned checkpoint fails.
func CheckWitnessed(dir string, v note.Verifier, witnesses []note.Verifier, quorum int) (int64, error) {
	msg, err := os.ReadFile(filepath.Join(dir, CosignedFile))
	if err != nil {
		return 0, fmt.Errorf("audit verify: %w: no witnessed checkpoint: %w", ErrWitnessQuorum, err)
	}
	n, err := note.Open(msg, note.VerifierList(append([]note.Verifier{v}, witnesses...)...))
	if err != nil {
		return 0, fmt.Errorf("audit verify: witnessed checkpoint: %w: %w", ErrSignature, err)
	}
	seen := map[uint32]bool{}
	for _, s := range n.Sigs {
		if s.Hash != v.KeyHash() {
			seen[s.Hash] = true
		}
	}
	if len(seen) < quorum || !signedBy(n, v) {
		return 0, fmt.Errorf("audit verify: %w: %d valid cosignatures, %d required", ErrWitnessQuorum, len(seen), quorum)
	}
	ck, err := parseCheckpointText(n.Text, v.Name())
	if err != nil {
		return 0, err
	}
	t, _, err := loadForVerify(dir)
	if err != nil {
		return 0, err
	}
	if err := checkSigned(t, ck); err != nil {
		return 0, fmt.Errorf("against the witnessed checkpoint: %w", err)
	}
	return ck.Size, nil
}

func signedBy(n *note.Note, v note.Verifier) bool {
	for _, s := range n.Sigs {
		if s.Hash == v.KeyHash() && s.Name == v.Name() {
			return true
		}
	}
	return false
}
