package wire

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Frame benchmarks, each with its baseline in the same run:
//
//	go test ./receiver/wire -run '^$' -bench 'Frame' -benchtime 2s
//
// decode/strict reads one frame and decodes the request and its args with
// every strict check; decode/plain reads the same bytes and runs plain
// encoding/json on them. encode/frame marshals and frames a request;
// encode/plain only marshals it.

func benchRequests() map[string]*Request {
	mk := func(op Op, args any) *Request {
		raw, _ := json.Marshal(args)
		return &Request{ID: 42, Op: op, TupleSHA256: testDigest, OpKey: "bench-key",
			Deadline: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), Args: raw}
	}
	return map[string]*Request{
		"exec_start": mk(OpExecStart, ExecStartArgs{Argv: []string{"/bin/sh", "-c", "make test"},
			Env: map[string]string{"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, OutputLimit: new(int64(1 << 20))}),
		"write_256KiB": mk(OpWrite, WriteArgs{Path: "src/main.go", Content: strings.Repeat("package main // x\n", 256<<10/18)}),
	}
}

func BenchmarkFrameDecode(b *testing.B) {
	for name, req := range benchRequests() {
		payload, _ := json.Marshal(req)
		frame, _ := AppendFrame(nil, payload, 0)
		b.Run(name+"/strict", func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			r := bytes.NewReader(frame)
			fr, _ := NewFrameReader(r, 0)
			for b.Loop() {
				r.Reset(frame)
				p, err := fr.ReadFrame()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := DecodeRequest(p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/plain", func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			buf := make([]byte, len(frame))
			r := bytes.NewReader(frame)
			for b.Loop() {
				r.Reset(frame)
				r.Read(buf)
				var got Request
				if err := json.Unmarshal(buf[headerSize:], &got); err != nil {
					b.Fatal(err)
				}
				var a any
				switch got.Op {
				case OpWrite:
					a = new(WriteArgs)
				default:
					a = new(ExecStartArgs)
				}
				if err := json.Unmarshal(got.Args, a); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkFrameEncode(b *testing.B) {
	for name, req := range benchRequests() {
		b.Run(name+"/frame", func(b *testing.B) {
			var buf []byte
			for b.Loop() {
				p, err := json.Marshal(req)
				if err != nil {
					b.Fatal(err)
				}
				if buf, err = AppendFrame(buf[:0], p, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/plain", func(b *testing.B) {
			for b.Loop() {
				if _, err := json.Marshal(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
