package custodian

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/tetherdev/tether/receiver/wire"
)

// requestDigest is the canonical digest of a keyed request: what it asks
// the receiver to do, independent of how the agent spelled its JSON and of
// its deadline, so a retry of the same request (same op key) matches and
// any change of what would run does not. It covers the ACP method, the
// session, the tuple digest, the receiver op, its args and extra (fields
// that change the outcome without reaching the receiver, such as the
// expected file digests of a verified exec). Version 2: a write's
// content is covered by its SHA-256 (writeDigest), not by its text.
func requestDigest(method, sessionID, tupleSHA256 string, op wire.Op, args, extra any) (string, error) {
	canon := struct {
		V           int     `json:"v"`
		Method      string  `json:"method"`
		SessionID   string  `json:"session_id"`
		TupleSHA256 string  `json:"tuple_sha256"`
		Op          wire.Op `json:"op"`
		Args        any     `json:"args"`
		Extra       any     `json:"extra,omitempty"`
	}{2, method, sessionID, tupleSHA256, op, args, extra}
	data, err := json.Marshal(canon)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// sha256String is sha256Hex of s without copying s whole: it hashes s in
// pieces of 64 KiB.
func sha256String(s string) string {
	h := sha256.New()
	for len(s) > 0 {
		n := min(len(s), 64<<10)
		h.Write([]byte(s[:n]))
		s = s[n:]
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// execDigests are the digests a terminal/create's dispatch record carries:
// of its argv (each argument NUL-terminated) and of its cwd.
func execDigests(args *wire.ExecStartArgs) map[string]string {
	var b []byte
	for _, s := range args.Argv {
		b = append(append(b, s...), 0)
	}
	return map[string]string{"argv": sha256Hex(b), "cwd": sha256Hex([]byte(args.Cwd))}
}
