// Package toolplan is the plugin's five tools (read_text_file,
// write_text_file, edit_text_file, list_directory, run_command) and the
// secondary glob and grep, on both sides of a plan: the plugin builds each
// call's plan here (Call.Read, Call.Run, ...: every request with its
// `_meta["tether/op"]`, malformed arguments refused before anything is
// sent), and plugin/host shapes the client's answers into the tool's
// result with the rules here (ApplyEdit, FinishList, FinishGlob,
// FinishGrep). Binding checks are plugin/server's.
package toolplan

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// MaxCallerOpKey is the longest operation key a caller may supply: the
// tools append ":<step>" (at most 8 bytes) and acpmeta caps keys at 128.
const MaxCallerOpKey = 112

// Call is one tool invocation in a bound session, as the plugin
// authorized it.
type Call struct {
	SessionID   string
	Root        string // the tuple's root: absolute, clean
	TupleSHA256 string
	// OpKey is the base operation key; request i carries OpKey + ":" + step.
	OpKey string
	// Deadline is the tool's deadline; every request's op meta carries it.
	Deadline time.Time
}

// OpKey returns callerKey when it is set and well formed, else a fresh
// random key. A malformed caller key is refused, never replaced, so that a
// retry cannot silently turn into a second execution.
func OpKey(callerKey string) (string, error) {
	if callerKey == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("fresh op key: %w", err)
		}
		return "op-" + hex.EncodeToString(b[:]), nil
	}
	if len(callerKey) > MaxCallerOpKey || !acpmeta.ValidOpKey(callerKey) {
		return "", errcode.Errorf(errcode.CodeInvalid, "op_key must be 1-%d of [A-Za-z0-9._:-]", MaxCallerOpKey)
	}
	return callerKey, nil
}

// meta returns the `_meta` of the request for step, with deadline. The op
// tag is encoded once, here; it crosses to the host and out on ACP as those
// bytes.
func (c Call) meta(step string, deadline time.Time) contract.Meta {
	return encodeMeta(acpmeta.KeyOp, acpmeta.Op{TupleSHA256: c.TupleSHA256, OpKey: c.OpKey + ":" + step, Deadline: deadline.UTC()})
}

// encodeMeta returns a one-entry `_meta` whose value is encoded once, now.
func encodeMeta(key string, v any) contract.Meta {
	b, err := json.Marshal(v)
	if err != nil {
		// Every value the tools encode is plain JSON data.
		panic(fmt.Sprintf("tools: marshal _meta[%q]: %v", key, err))
	}
	return contract.Meta{key: b}
}

// Resolve maps a tool path to the absolute path inside the computer: a
// relative path is taken from the root; the result must be the root or
// below it. This is a lexical check only: the receiver resolves symlinks
// and is the authority on confinement.
func Resolve(root, p string) (string, error) {
	if p == "" {
		return "", errcode.Errorf(errcode.CodeInvalid, "path is required")
	}
	if strings.ContainsAny(p, "\x00") {
		return "", errcode.Errorf(errcode.CodeInvalid, "path contains NUL")
	}
	abs := path.Clean(p)
	if !path.IsAbs(p) {
		abs = path.Join(root, p)
	}
	if !within(root, abs) {
		return "", errcode.Errorf(errcode.CodePathEscape, "path %q resolves to %q, outside the tuple root %q", p, abs, root)
	}
	return abs, nil
}

func within(root, abs string) bool {
	if root == "/" {
		return path.IsAbs(abs)
	}
	return abs == root || strings.HasPrefix(abs, root+"/")
}

// Resolve resolves p against c's root.
func (c Call) Resolve(p string) (string, error) { return Resolve(c.Root, p) }
