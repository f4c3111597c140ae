package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/strictjson"
)

// Protocol limits on fields, checked when a request is decoded (a breach is
// answered with CodeInvalid; the connection stays up). docs/protocol.md
// lists them under "Limits".
const (
	MaxPathBytes   = 4096 // one path argument
	MaxPaths       = 1024 // HashArgs.Paths, ExecStartArgs.HashAfterExit
	MaxArgv        = 1024 // ExecStartArgs.Argv entries
	MaxEnv         = 256  // ExecStartArgs.Env entries
	MaxTerminalID  = 128  // TerminalArgs.TerminalID bytes
	MaxOpKeyBytes  = 128  // Request.OpKey
	MaxLineOrLimit = 1 << 30
	// MaxChunkBytes bounds the bytes of one read_chunk or write_chunk: in
	// base64 with its envelope, a chunk this size still fits one 1 MiB frame.
	MaxChunkBytes = 764 << 10
	// MaxTransferBytes bounds offsets and sizes of chunked files (the
	// grant's and the receiver's max_file_bytes apply within it).
	MaxTransferBytes = 1 << 40
	MaxTransferID    = 128   // TransferArgs.TransferID bytes
	maxModeBits      = 0o777 // WriteArgs.Mode: permission bits only
	tupleDigestSize  = 64
)

// ArgsType returns the Go type of op's args (for example ReadArgs for
// OpRead), or nil when op is not in the closed set.
func ArgsType(op Op) reflect.Type {
	switch op {
	case OpAttach:
		return reflect.TypeFor[AttachArgs]()
	case OpRead:
		return reflect.TypeFor[ReadArgs]()
	case OpWrite:
		return reflect.TypeFor[WriteArgs]()
	case OpStat:
		return reflect.TypeFor[StatArgs]()
	case OpList:
		return reflect.TypeFor[ListArgs]()
	case OpHash:
		return reflect.TypeFor[HashArgs]()
	case OpExecStart:
		return reflect.TypeFor[ExecStartArgs]()
	case OpExecOutput, OpExecWait, OpExecKill, OpExecRelease:
		return reflect.TypeFor[TerminalArgs]()
	case OpReadChunk:
		return reflect.TypeFor[ReadChunkArgs]()
	case OpWriteBegin:
		return reflect.TypeFor[WriteBeginArgs]()
	case OpWriteChunk:
		return reflect.TypeFor[WriteChunkArgs]()
	case OpWriteCommit, OpWriteAbort:
		return reflect.TypeFor[TransferArgs]()
	}
	return nil
}

// DecodeArgs strictly decodes raw as the args of op and returns a pointer
// to the typed struct from messages.go (*ReadArgs for OpRead, *TerminalArgs
// for the exec_output/wait/kill/release ops, ...). The receiver's server and
// the fuzzers share this one decoder.
//
// Two kinds of failure: a structural one (unknown op, not one JSON object,
// unknown or duplicate field, wrong type, trailing data) wraps ErrMalformed
// or ErrProtocol and is fatal to the connection; a field that breaks a
// documented bound (negative line, mode beyond 0777, empty argv, ...) is an
// *Error with CodeInvalid, answered without closing the connection. Policy
// (path confinement, loader variables, grant limits) is the receiver's.
func DecodeArgs(op Op, raw json.RawMessage) (any, error) {
	t := ArgsType(op)
	if t == nil {
		return nil, fmt.Errorf("%w: unknown op %q", ErrProtocol, op)
	}
	v := reflect.New(t).Interface()
	switch {
	case len(raw) == 0:
		return nil, fmt.Errorf("%w: op %s: args missing", ErrMalformed, op)
	case len(raw) > MaxFrameSize: // only args built in-process; a frame cannot hold them
		return nil, errcode.Errorf(errcode.CodeTooLarge, "op %s: args of %d bytes exceed the frame ceiling of %d", op, len(raw), MaxFrameSize)
	}
	if err := decodeStrict(raw, v); err != nil {
		return nil, fmt.Errorf("op %s args: %w", op, err)
	}
	if val, ok := v.(validator); ok {
		if e := val.validate(); e != nil {
			return nil, e
		}
	}
	return v, nil
}

// decodeStrict decodes a frame's JSON, or a part of it, with the one strict
// decoder (admission/strictjson: duplicate, unknown and case-folded keys,
// invalid UTF-8, deep nesting and trailing data are refused) within the
// protocol's frame ceiling. Every failure wraps ErrMalformed.
func decodeStrict(data []byte, v any) error {
	if err := strictjson.Decode(data, MaxFrameSize, v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// DecodeResult decodes a response's result into v with the same strict
// decoder; the client (receiver/wireclient) calls it.
func DecodeResult(data []byte, v any) error { return decodeStrict(data, v) }

// decodeStrictExcept is decodeStrict for a frame whose member key (the
// request's args, the response's result) is large: that member is not
// decoded with the envelope, which would scan it twice more only to copy
// it, but returned as a copy of its bytes (nil when absent; the frame's
// buffer is reused). The strict checks still cover the whole frame; the
// member's value is valid JSON for certain only once it is decoded strictly
// as its own type (DecodeArgs, the client's result) or checked with
// json.Valid, which every caller does before using it.
func decodeStrictExcept(data []byte, v any, key string) (json.RawMessage, error) {
	raw, err := strictjson.DecodeWithRaw(data, MaxFrameSize, v, key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if raw == nil {
		return nil, nil
	}
	return append(json.RawMessage(nil), raw...), nil
}

// DecodeArgs returns the typed args of r (see the package function
// DecodeArgs). On a request the server dispatched, the args were already
// decoded and validated once, and that value is returned.
func (r *Request) DecodeArgs() (any, error) {
	if r.args != nil {
		return r.args, nil
	}
	return DecodeArgs(r.Op, r.Args)
}

// DecodeRequest strictly decodes one request frame payload: the envelope,
// then its args with DecodeArgs. A structural failure wraps ErrMalformed or
// ErrProtocol and is fatal to the connection. A semantic failure (malformed
// tuple_sha256 or op_key, missing deadline, an arg out of bounds) returns
// the decoded request together with an *Error to answer it with.
func DecodeRequest(payload []byte) (*Request, error) {
	var req Request
	raw, err := decodeStrictExcept(payload, &req, "args")
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	req.Args = raw
	if req.ID == 0 {
		return nil, fmt.Errorf("%w: request id 0 is reserved", ErrProtocol)
	}
	if !req.Op.Valid() {
		return nil, fmt.Errorf("%w: unknown op %q", ErrProtocol, req.Op)
	}
	args, err := DecodeArgs(req.Op, req.Args)
	var werr *errcode.Error
	switch {
	case errors.As(err, &werr):
		return &req, werr
	case err != nil:
		return nil, fmt.Errorf("request %d: %w", req.ID, err)
	}
	req.args = args
	if e := checkEnvelope(&req); e != nil {
		return &req, e
	}
	return &req, nil
}

// checkEnvelope checks what every request carries: a tuple digest, an
// operation key and a deadline.
func checkEnvelope(r *Request) *errcode.Error {
	switch {
	case !ValidDigest(r.TupleSHA256):
		return errcode.Errorf(errcode.CodeInvalid, "tuple_sha256 is not 64 lowercase hex digits")
	case !ValidOpKey(r.OpKey):
		return errcode.Errorf(errcode.CodeInvalid, "op_key is not 1..%d characters of [A-Za-z0-9._:-]", MaxOpKeyBytes)
	case r.Deadline.IsZero():
		return errcode.Errorf(errcode.CodeInvalid, "deadline missing")
	}
	return nil
}

// DecodeResponse strictly decodes one response frame payload. Every
// failure is fatal to the connection: invalid JSON, unknown fields, neither
// or both of result and error, an error code outside the closed set.
func DecodeResponse(payload []byte) (*Response, error) {
	var resp Response
	result, err := decodeStrictExcept(payload, &resp, "result")
	if err != nil {
		return nil, fmt.Errorf("response: %w", err)
	}
	resp.Result = result
	hasResult := len(resp.Result) > 0 && string(resp.Result) != "null"
	switch {
	case resp.Error != nil && hasResult:
		return nil, fmt.Errorf("%w: response %d has both result and error", ErrProtocol, resp.ID)
	case resp.Error == nil && !hasResult:
		return nil, fmt.Errorf("%w: response %d has neither result nor error", ErrProtocol, resp.ID)
	case resp.Error != nil && !resp.Error.Code.Valid():
		return nil, fmt.Errorf("%w: response %d: error code %q is not in the closed set",
			ErrProtocol, resp.ID, resp.Error.Code)
	case resp.ID == 0 && resp.Error == nil:
		return nil, fmt.Errorf("%w: a notice (id 0) must carry an error", ErrProtocol)
	}
	return &resp, nil
}

// ValidDigest reports whether d is a lowercase hex SHA-256 (tuple_sha256,
// expect_sha256).
func ValidDigest(d string) bool {
	if len(d) != tupleDigestSize {
		return false
	}
	for i := range len(d) {
		c := d[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ValidOpKey reports whether k is 1..MaxOpKeyBytes characters of
// [A-Za-z0-9._:-], the operation key syntax of the ACP contract.
func ValidOpKey(k string) bool {
	if len(k) == 0 || len(k) > MaxOpKeyBytes {
		return false
	}
	for i := range len(k) {
		c := k[i]
		ok := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// ExpiredError is the refusal of a request whose deadline has already
// passed when the server dispatches it (receiver/wireserver).
func ExpiredError(deadline, now time.Time) *errcode.Error {
	return errcode.Errorf(errcode.CodeTimeout, "request deadline %s passed %s before dispatch",
		deadline.UTC().Format(time.RFC3339Nano), now.Sub(deadline).Round(time.Millisecond))
}

// validator is implemented by args with documented bounds.
type validator interface{ validate() *errcode.Error }

func checkPath(field, p string) *errcode.Error {
	switch {
	case p == "":
		return errcode.Errorf(errcode.CodeInvalid, "%s is empty", field)
	case len(p) > MaxPathBytes:
		return errcode.Errorf(errcode.CodeInvalid, "%s longer than %d bytes", field, MaxPathBytes)
	case strings.IndexByte(p, 0) >= 0:
		return errcode.Errorf(errcode.CodeInvalid, "%s contains NUL", field)
	}
	return nil
}

func checkPaths(field string, ps []string, required bool) *errcode.Error {
	switch {
	case required && len(ps) == 0:
		return errcode.Errorf(errcode.CodeInvalid, "%s is empty", field)
	case len(ps) > MaxPaths:
		return errcode.Errorf(errcode.CodeInvalid, "%s has more than %d entries", field, MaxPaths)
	}
	for i, p := range ps {
		if e := checkPath(fmt.Sprintf("%s[%d]", field, i), p); e != nil {
			return e
		}
	}
	return nil
}

func (a *ReadArgs) validate() *errcode.Error {
	if a.Line < 0 || a.Limit < 0 || a.Line > MaxLineOrLimit || a.Limit > MaxLineOrLimit {
		return errcode.Errorf(errcode.CodeInvalid, "line and limit must be in 0..%d", MaxLineOrLimit)
	}
	return checkPath("path", a.Path)
}

func (a *WriteArgs) validate() *errcode.Error {
	switch {
	case a.Mode > maxModeBits:
		return errcode.Errorf(errcode.CodeInvalid, "mode %#o has bits beyond 0777 (no setuid, setgid or sticky)", a.Mode)
	case a.ExpectSHA256 != "" && !ValidDigest(a.ExpectSHA256):
		return errcode.Errorf(errcode.CodeInvalid, "expect_sha256 is not 64 lowercase hex digits")
	case a.ExpectSHA256 != "" && a.ExpectAbsent:
		return errcode.Errorf(errcode.CodeInvalid, "expect_sha256 and expect_absent are exclusive")
	}
	return checkPath("path", a.Path)
}

func (a *StatArgs) validate() *errcode.Error { return checkPath("path", a.Path) }
func (a *ListArgs) validate() *errcode.Error { return checkPath("path", a.Path) }
func (a *HashArgs) validate() *errcode.Error { return checkPaths("paths", a.Paths, true) }

func (a *TerminalArgs) validate() *errcode.Error {
	if a.TerminalID == "" || len(a.TerminalID) > MaxTerminalID {
		return errcode.Errorf(errcode.CodeInvalid, "terminal_id must be 1..%d bytes", MaxTerminalID)
	}
	return nil
}

func (a *ExecStartArgs) validate() *errcode.Error {
	switch {
	case len(a.Argv) == 0 || a.Argv[0] == "":
		return errcode.Errorf(errcode.CodeInvalid, "argv is empty")
	case len(a.Argv) > MaxArgv:
		return errcode.Errorf(errcode.CodeInvalid, "argv has more than %d entries", MaxArgv)
	case len(a.Env) > MaxEnv:
		return errcode.Errorf(errcode.CodeInvalid, "env has more than %d entries", MaxEnv)
	case a.OutputLimit != nil && *a.OutputLimit < 0:
		return errcode.Errorf(errcode.CodeInvalid, "output_limit is negative")
	}
	for i, s := range a.Argv {
		if strings.IndexByte(s, 0) >= 0 {
			return errcode.Errorf(errcode.CodeInvalid, "argv[%d] contains NUL", i)
		}
	}
	for k, v := range a.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return errcode.Errorf(errcode.CodeInvalid, "env name %q is empty or contains '=' or NUL (or its value NUL)", k)
		}
	}
	if a.Cwd != "" {
		if e := checkPath("cwd", a.Cwd); e != nil {
			return e
		}
	}
	return checkPaths("hash_after_exit", a.HashAfterExit, false)
}

func (a *ReadChunkArgs) validate() *errcode.Error {
	switch {
	case a.Offset < 0 || a.Offset > MaxTransferBytes:
		return errcode.Errorf(errcode.CodeInvalid, "offset must be in 0..%d", int64(MaxTransferBytes))
	case a.Length < 1 || a.Length > MaxChunkBytes:
		return errcode.Errorf(errcode.CodeInvalid, "length must be in 1..%d", MaxChunkBytes)
	}
	return checkPath("path", a.Path)
}

func (a *WriteBeginArgs) validate() *errcode.Error {
	switch {
	case a.Size < 0 || a.Size > MaxTransferBytes:
		return errcode.Errorf(errcode.CodeInvalid, "size must be in 0..%d", int64(MaxTransferBytes))
	case !ValidDigest(a.SHA256):
		return errcode.Errorf(errcode.CodeInvalid, "sha256 is not 64 lowercase hex digits")
	}
	w := WriteArgs{Path: a.Path, Mode: a.Mode, ExpectSHA256: a.ExpectSHA256, ExpectAbsent: a.ExpectAbsent}
	return w.validate()
}

func checkTransferID(id string) *errcode.Error {
	if id == "" || len(id) > MaxTransferID {
		return errcode.Errorf(errcode.CodeInvalid, "transfer_id must be 1..%d bytes", MaxTransferID)
	}
	return nil
}

func (a *WriteChunkArgs) validate() *errcode.Error {
	switch {
	case a.Offset < 0 || a.Offset > MaxTransferBytes:
		return errcode.Errorf(errcode.CodeInvalid, "offset must be in 0..%d", int64(MaxTransferBytes))
	case len(a.Data) == 0 || len(a.Data) > MaxChunkBytes:
		return errcode.Errorf(errcode.CodeInvalid, "data must be 1..%d bytes", MaxChunkBytes)
	}
	return checkTransferID(a.TransferID)
}

func (a *TransferArgs) validate() *errcode.Error { return checkTransferID(a.TransferID) }
