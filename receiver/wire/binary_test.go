package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
)

const binDigest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// binChunkReq is a binary write_chunk request frame payload carrying data.
func binChunkReq(t testing.TB, id uint64, data []byte) []byte {
	t.Helper()
	req := Request{ID: id, Op: OpWriteChunk, TupleSHA256: binDigest, OpKey: "op-1",
		Deadline: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), Args: []byte(`{"transfer_id":"t1","offset":7}`)}
	p, err := EncodeBinaryRequest(&req, data)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBinaryRequestRoundTrip(t *testing.T) {
	data := []byte("raw \x00\xff bytes, not base64")
	req, err := DecodeRequestFrame(binChunkReq(t, 9, data))
	if err != nil {
		t.Fatal(err)
	}
	args, err := req.DecodeArgs()
	if err != nil {
		t.Fatal(err)
	}
	a := args.(*WriteChunkArgs)
	if req.ID != 9 || a.TransferID != "t1" || a.Offset != 7 || !bytes.Equal(a.Data, data) {
		t.Fatalf("decoded %+v args %+v", req, a)
	}
}

// The data is a copy: the frame reader reuses its buffer for the next frame.
func TestBinaryRequestDataIsCopied(t *testing.T) {
	p := binChunkReq(t, 1, []byte("abc"))
	req, err := DecodeRequestFrame(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range p {
		p[i] = 0
	}
	if a, _ := req.DecodeArgs(); string(a.(*WriteChunkArgs).Data) != "abc" {
		t.Fatalf("data aliases the frame: %q", a.(*WriteChunkArgs).Data)
	}
}

func TestBinaryRequestRefusals(t *testing.T) {
	good := binChunkReq(t, 1, []byte("payload"))
	corrupt := func(f func(p []byte) []byte) []byte { return f(bytes.Clone(good)) }
	hdrLen := int(binary.BigEndian.Uint32(good[1:5]))
	for _, c := range []struct {
		name string
		in   []byte
		want error
		msg  string
	}{
		{"digest", corrupt(func(p []byte) []byte { p[5+hdrLen] ^= 1; return p }), ErrMalformed, "sha256"},
		{"version", corrupt(func(p []byte) []byte { p[0] = 0xB2; return p }), ErrProtocol, "version 0xb2"},
		{"short", good[:BinaryOverhead-1], ErrMalformed, "shorter"},
		{"header zero", corrupt(func(p []byte) []byte { binary.BigEndian.PutUint32(p[1:5], 0); return p }), ErrMalformed, "out of range"},
		{"header long", corrupt(func(p []byte) []byte { binary.BigEndian.PutUint32(p[1:5], uint32(len(p))); return p }), ErrMalformed, "out of range"},
		{"not write_chunk", func() []byte {
			req := Request{ID: 1, Op: OpStat, TupleSHA256: binDigest, OpKey: "k", Deadline: time.Now(), Args: []byte(`{"path":"a"}`)}
			h, _ := EncodeRequest(&req)
			return AppendBinary(nil, h, []byte("x"))
		}(), ErrProtocol, "binary frame"},
		{"data twice", func() []byte {
			req := Request{ID: 1, Op: OpWriteChunk, TupleSHA256: binDigest, OpKey: "k", Deadline: time.Now(),
				Args: []byte(`{"transfer_id":"t","offset":0,"data":"eA=="}`)}
			h, _ := EncodeRequest(&req)
			return AppendBinary(nil, h, []byte("x"))
		}(), ErrMalformed, "both"},
		{"unknown field", func() []byte {
			h := []byte(`{"id":1,"op":"write_chunk","tuple_sha256":"` + binDigest + `","op_key":"k","deadline":"2030-01-01T00:00:00Z","args":{"transfer_id":"t","offset":0},"extra":1}`)
			return AppendBinary(nil, h, []byte("x"))
		}(), ErrMalformed, "extra"},
	} {
		req, err := DecodeRequestFrame(c.in)
		if !errors.Is(err, c.want) || req != nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: req %v err %v, want %v naming %q", c.name, req, err, c.want, c.msg)
		}
	}
	// An empty chunk is refused as a JSON one is (CodeInvalid, connection kept).
	_, err := DecodeRequestFrame(binChunkReq(t, 1, nil))
	if codeOf(err) != errcode.CodeInvalid {
		t.Errorf("empty binary chunk: %v", err)
	}
}

// An old peer (the JSON-only decoders) refuses a binary frame as malformed,
// and refuses the field that asks for binary frames by its name: the
// negotiation fails cleanly before any binary frame is sent.
func TestBinaryOldPeerRefusesClearly(t *testing.T) {
	if _, err := DecodeRequest(binChunkReq(t, 1, []byte("x"))); !errors.Is(err, ErrMalformed) {
		t.Fatalf("JSON decoder on a binary frame: %v", err)
	}
	type oldWriteBeginArgs struct { // WriteBeginArgs before binary frames
		Path         string `json:"path"`
		Size         int64  `json:"size"`
		SHA256       string `json:"sha256"`
		Mode         uint32 `json:"mode,omitempty"`
		ExpectSHA256 string `json:"expect_sha256,omitempty"`
		ExpectAbsent bool   `json:"expect_absent,omitempty"`
	}
	in := []byte(`{"path":"f","size":1,"sha256":"` + binDigest + `","binary":true}`)
	if err := decodeStrict(in, &oldWriteBeginArgs{}); err == nil || !strings.Contains(err.Error(), "binary") {
		t.Fatalf("old write_begin args: %v, want a refusal naming binary", err)
	}
	if _, err := DecodeArgs(OpWriteBegin, in); err != nil { // positive control: the new peer accepts it
		t.Fatal(err)
	}
}

func TestBinaryReadChunkAnswerRoundTrip(t *testing.T) {
	data := bytes.Repeat([]byte{0, 1, 2, 0xff}, 1000)
	p, err := EncodeBinaryReadChunk(5, &ReadChunkResult{Data: data, Size: 12345})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := DecodeResponseFrame(p)
	if err != nil {
		t.Fatal(err)
	}
	var res ReadChunkResult
	if err := BinaryReadChunkResult(resp, &res); err != nil {
		t.Fatal(err)
	}
	if resp.ID != 5 || res.Size != 12345 || !bytes.Equal(res.Data, data) {
		t.Fatalf("resp %d res size %d data %d bytes", resp.ID, res.Size, len(res.Data))
	}
	// The JSON decoder refuses the binary frame: a client that never asked gets no garbage.
	if _, err := DecodeResponse(p); !errors.Is(err, ErrMalformed) {
		t.Fatalf("JSON decoder on a binary answer: %v", err)
	}
}

func TestBinaryResponseRefusals(t *testing.T) {
	for _, c := range []struct {
		name, header string
		want         error
	}{
		{"error", `{"id":1,"error":{"code":"invalid","message":"m"}}`, ErrProtocol},
		{"notice", `{"id":0,"error":{"code":"unavailable","message":"m"}}`, ErrProtocol},
		{"duplicate", `{"id":1,"id":2,"result":{"size":1}}`, ErrMalformed},
	} {
		if _, err := DecodeResponseFrame(AppendBinary(nil, []byte(c.header), []byte("x"))); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	resp, err := DecodeResponseFrame(AppendBinary(nil, []byte(`{"id":1,"result":{"size":1,"data":"eA=="}}`), []byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	if err := BinaryReadChunkResult(resp, &ReadChunkResult{}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("data in the header of a binary answer: %v", err)
	}
}
