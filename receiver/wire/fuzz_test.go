package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/tetherdev/tether/admission/errcode"
)

// Seed corpora live in testdata/fuzz/<FuzzName>/; run one fuzzer with
//   go test ./receiver/wire -run '^$' -fuzz '^FuzzReadFrame$' -fuzztime 20s

// FuzzReadFrame feeds arbitrary bytes to the frame reader: it never
// panics, every frame it returns is within the limit and non-empty, the
// frames re-encode to exactly the bytes consumed, and it stops with one of
// the documented errors.
func FuzzReadFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		const limit = 64
		br := bytes.NewReader(in)
		fr, err := NewFrameReader(br, limit)
		if err != nil {
			t.Fatal(err)
		}
		var reencoded []byte
		for {
			p, err := fr.ReadFrame()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrFrameTruncated) &&
					!errors.Is(err, ErrFrameEmpty) && !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("undocumented error %v", err)
				}
				if errors.Is(err, io.EOF) && !bytes.Equal(reencoded, in) {
					t.Fatalf("clean end but frames %x != input %x", reencoded, in)
				}
				return
			}
			if len(p) == 0 || len(p) > limit {
				t.Fatalf("frame of %d bytes with limit %d", len(p), limit)
			}
			if reencoded, err = AppendFrame(reencoded, p, limit); err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(in, reencoded) {
				t.Fatalf("frames %x are not a prefix of the input", reencoded)
			}
		}
	})
}

// FuzzDecodeRequest checks the three outcomes of DecodeRequest: a fatal
// fault (ErrMalformed or ErrProtocol, no request), a refusal (*Error
// CodeInvalid with the request), or a request whose args have the op's
// type and that survives a re-encode unchanged. Whatever strict decoding
// accepts, plain encoding/json decodes to the same value.
func FuzzDecodeRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		req, err := DecodeRequest(in)
		var werr *errcode.Error
		switch {
		case errors.As(err, &werr):
			if werr.Code != errcode.CodeInvalid || req == nil || req.ID == 0 {
				t.Fatalf("refusal %v with request %+v", werr, req)
			}
			return
		case err != nil:
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrProtocol) {
				t.Fatalf("undocumented error %v", err)
			}
			if req != nil {
				t.Fatal("a fatal fault returned a request")
			}
			return
		}
		if req.ID == 0 || !req.Op.Valid() {
			t.Fatalf("accepted %+v", req)
		}
		args, err := req.DecodeArgs()
		if err != nil || reflect.TypeOf(args).Elem() != ArgsType(req.Op) {
			t.Fatalf("args %T (%v) for op %s", args, err, req.Op)
		}
		var plain Request
		if err := json.Unmarshal(in, &plain); err != nil {
			t.Fatalf("strict accepted what encoding/json refuses: %v", err)
		}
		plain.args = req.args
		if !reflect.DeepEqual(&plain, req) {
			t.Fatalf("strict %+v != plain %+v", req, plain)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		req2, err := DecodeRequest(again)
		if err != nil || req2.ID != req.ID || req2.Op != req.Op || !req2.Deadline.Equal(req.Deadline) {
			t.Fatalf("re-encoded request %s decodes to %+v (%v)", again, req2, err)
		}
	})
}

// FuzzDecodeResponse: no panic; an accepted answer has exactly one of
// result and error, a code from the closed set, and notices carry errors.
// The result is left undecoded (the caller decodes it as its own type);
// when it is valid JSON, encoding/json accepts the whole answer and reads
// the same result bytes.
func FuzzDecodeResponse(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		resp, err := DecodeResponse(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrProtocol) {
				t.Fatalf("undocumented error %v", err)
			}
			return
		}
		hasResult := len(resp.Result) > 0 && string(resp.Result) != "null"
		if hasResult == (resp.Error != nil) {
			t.Fatalf("accepted %+v", resp)
		}
		if resp.Error != nil && !resp.Error.Code.Valid() {
			t.Fatalf("accepted code %q", resp.Error.Code)
		}
		if resp.ID == 0 && resp.Error == nil {
			t.Fatal("accepted a notice without an error")
		}
		if !hasResult || !json.Valid(resp.Result) {
			return
		}
		var plain Response
		if err := json.Unmarshal(in, &plain); err != nil || !bytes.Equal(plain.Result, resp.Result) {
			t.Fatalf("result %q; encoding/json read %q (%v)", resp.Result, plain.Result, err)
		}
	})
}

// fuzzArgs is the body of the per-op args fuzzers.
func fuzzArgs(f *testing.F, op Op) {
	f.Fuzz(func(t *testing.T, in []byte) {
		v, err := DecodeArgs(op, in)
		var werr *errcode.Error
		switch {
		case errors.As(err, &werr):
			if werr.Code != errcode.CodeInvalid || v != nil {
				t.Fatalf("refusal %v with value %v", werr, v)
			}
			return
		case err != nil:
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("undocumented error %v", err)
			}
			return
		}
		if reflect.TypeOf(v) != reflect.PointerTo(ArgsType(op)) {
			t.Fatalf("%s decoded to %T", op, v)
		}
		plain := reflect.New(ArgsType(op)).Interface()
		if err := json.Unmarshal(in, plain); err != nil || !reflect.DeepEqual(plain, v) {
			t.Fatalf("strict %+v, plain %+v (%v)", v, plain, err)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		v2, err := DecodeArgs(op, again)
		if err != nil {
			t.Fatalf("re-encoded %s refused: %v", again, err)
		}
		if again2, _ := json.Marshal(v2); !bytes.Equal(again, again2) { // omitempty folds {} and null
			t.Fatalf("re-encoded %s decodes to %s", again, again2)
		}
	})
}

func FuzzArgsAttach(f *testing.F)      { fuzzArgs(f, OpAttach) }
func FuzzArgsRead(f *testing.F)        { fuzzArgs(f, OpRead) }
func FuzzArgsWrite(f *testing.F)       { fuzzArgs(f, OpWrite) }
func FuzzArgsStat(f *testing.F)        { fuzzArgs(f, OpStat) }
func FuzzArgsList(f *testing.F)        { fuzzArgs(f, OpList) }
func FuzzArgsHash(f *testing.F)        { fuzzArgs(f, OpHash) }
func FuzzArgsExecStart(f *testing.F)   { fuzzArgs(f, OpExecStart) }
func FuzzArgsExecOutput(f *testing.F)  { fuzzArgs(f, OpExecOutput) }
func FuzzArgsExecWait(f *testing.F)    { fuzzArgs(f, OpExecWait) }
func FuzzArgsExecKill(f *testing.F)    { fuzzArgs(f, OpExecKill) }
func FuzzArgsExecRelease(f *testing.F) { fuzzArgs(f, OpExecRelease) }
func FuzzArgsReadChunk(f *testing.F)   { fuzzArgs(f, OpReadChunk) }
func FuzzArgsWriteBegin(f *testing.F)  { fuzzArgs(f, OpWriteBegin) }
func FuzzArgsWriteChunk(f *testing.F)  { fuzzArgs(f, OpWriteChunk) }
func FuzzArgsWriteCommit(f *testing.F) { fuzzArgs(f, OpWriteCommit) }

// FuzzDecodeBinaryRequest: a binary request frame either is refused
// (ErrMalformed or ErrProtocol with no request, or a CodeInvalid refusal
// with one) or decodes to a write_chunk whose data is the frame's, whose
// digest matched, and which encodes back to a frame that decodes alike.
func FuzzDecodeBinaryRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		req, err := DecodeRequestFrame(append([]byte{BinaryV1}, in...))
		var werr *errcode.Error
		switch {
		case errors.As(err, &werr):
			if werr.Code != errcode.CodeInvalid || req == nil || req.ID == 0 {
				t.Fatalf("refusal %v with request %+v", werr, req)
			}
			return
		case err != nil:
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrProtocol) {
				t.Fatalf("undocumented error %v", err)
			}
			if req != nil {
				t.Fatal("a fatal fault returned a request")
			}
			return
		}
		args, err := req.DecodeArgs()
		a, ok := args.(*WriteChunkArgs)
		if err != nil || !ok || req.Op != OpWriteChunk || req.ID == 0 || len(a.Data) == 0 || len(a.Data) > MaxChunkBytes {
			t.Fatalf("accepted %+v args %T (%v)", req, args, err)
		}
		head := *req
		head.Args, _ = json.Marshal(&WriteChunkArgs{TransferID: a.TransferID, Offset: a.Offset})
		head.Args = bytes.Replace(head.Args, []byte(`,"data":null`), nil, 1)
		again, err := EncodeBinaryRequest(&head, a.Data)
		if err != nil {
			t.Fatal(err)
		}
		req2, err := DecodeRequestFrame(again)
		if err != nil {
			t.Fatalf("re-encoded frame refused: %v", err)
		}
		a2, _ := req2.DecodeArgs()
		if !reflect.DeepEqual(a2, a) || req2.ID != req.ID || !req2.Deadline.Equal(req.Deadline) {
			t.Fatalf("re-encoded %+v, want %+v", a2, a)
		}
	})
}

// FuzzDecodeBinaryResponse: a binary answer either is refused with
// ErrMalformed or ErrProtocol, or has an id other than 0, a result and no
// error, and data whose digest matched; its read_chunk result, when it
// decodes, carries that data.
func FuzzDecodeBinaryResponse(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		resp, err := DecodeResponseFrame(append([]byte{BinaryV1}, in...))
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrProtocol) {
				t.Fatalf("undocumented error %v", err)
			}
			return
		}
		if resp.ID == 0 || resp.Error != nil || !resp.Binary || resp.Data == nil {
			t.Fatalf("accepted %+v", resp)
		}
		var res ReadChunkResult
		if err := BinaryReadChunkResult(resp, &res); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("undocumented error %v", err)
			}
			return
		}
		if !bytes.Equal(res.Data, resp.Data) {
			t.Fatal("result data differs from the frame's")
		}
	})
}
