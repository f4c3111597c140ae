package wire

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/tetherdev/tether/admission/errcode"
)

// envelope wraps args in an otherwise valid request.
func envelope(op, args string) []byte {
	return fmt.Appendf(nil, `{"id":7,"op":%q,"tuple_sha256":%q,"op_key":"k1","deadline":"2030-01-01T00:00:00Z","args":%s}`,
		op, testDigest, args)
}

func TestDecodeRequestValid(t *testing.T) {
	req, err := DecodeRequest(envelope("read", `{"path":"a/b.txt","line":3,"limit":10}`))
	if err != nil {
		t.Fatal(err)
	}
	if req.ID != 7 || req.Op != OpRead || req.OpKey != "k1" || req.Deadline.Year() != 2030 {
		t.Fatalf("envelope decoded wrong: %+v", req)
	}
	args, err := req.DecodeArgs()
	if err != nil {
		t.Fatal(err)
	}
	want := &ReadArgs{Path: "a/b.txt", Line: 3, Limit: 10}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("args = %#v, want %#v", args, want)
	}
}

// TestDecodeRequestFence: the fencing token is an optional uint64; absent
// and 0 both mean none.
func TestDecodeRequestFence(t *testing.T) {
	ok := string(envelope("stat", `{"path":"x"}`))
	for payload, want := range map[string]uint64{
		ok: 0,
		strings.Replace(ok, `"id":7`, `"id":7,"fence":0`, 1):                    0,
		strings.Replace(ok, `"id":7`, `"id":7,"fence":null`, 1):                 0,
		strings.Replace(ok, `"id":7`, `"id":7,"fence":42`, 1):                   42,
		strings.Replace(ok, `"id":7`, `"id":7,"fence":18446744073709551615`, 1): 1<<64 - 1,
	} {
		req, err := DecodeRequest([]byte(payload))
		if err != nil || req.Fence != want {
			t.Fatalf("%s: fence %v (%v), want %d", payload, req, err, want)
		}
	}
}

// Structural faults are fatal: each must wrap ErrMalformed or ErrProtocol
// and return no request to answer.
func TestDecodeRequestRefusesStructure(t *testing.T) {
	ok := string(envelope("stat", `{"path":"x"}`))
	cases := map[string]string{
		"not json":               `{"id":`,
		"array":                  `[1,2]`,
		"null":                   `null`,
		"trailing object":        ok + `{}`,
		"trailing garbage":       ok + ` x`,
		"unknown envelope field": strings.Replace(ok, `"id":7`, `"id":7,"extra":1`, 1),
		"duplicate envelope key": strings.Replace(ok, `"id":7`, `"id":7,"id":8`, 1),
		"case-folded key":        strings.Replace(ok, `"op_key"`, `"OP_KEY"`, 1),
		"case-folded duplicate":  strings.Replace(ok, `"op":"stat"`, `"op":"stat","Op":"write"`, 1),
		"unknown op":             string(envelope("exec", `{}`)),
		"empty op":               string(envelope("", `{}`)),
		"id zero":                strings.Replace(ok, `"id":7`, `"id":0`, 1),
		"negative id":            strings.Replace(ok, `"id":7`, `"id":-1`, 1),
		"float id":               strings.Replace(ok, `"id":7`, `"id":7.5`, 1),
		"string id":              strings.Replace(ok, `"id":7`, `"id":"7"`, 1),
		"bad deadline":           strings.Replace(ok, `2030-01-01T00:00:00Z`, `tomorrow`, 1),
		"args missing":           strings.Replace(ok, `,"args":{"path":"x"}`, ``, 1),
		"args null":              string(envelope("stat", `null`)),
		"args array":             string(envelope("stat", `["x"]`)),
		"args unknown field":     string(envelope("stat", `{"path":"x","follow":true}`)),
		"args duplicate key":     string(envelope("stat", `{"path":"x","path":"../y"}`)),
		"args case-folded key":   string(envelope("stat", `{"PATH":"x"}`)),
		"args wrong type":        string(envelope("read", `{"path":"x","line":"1"}`)),
		"env duplicate":          string(envelope("exec_start", `{"argv":["/bin/true"],"env":{"A":"1","A":"2"}}`)),
		"invalid utf8":           strings.Replace(ok, `"k1"`, "\"k\xff\"", 1),
		"too deep":               `{"id":1,"op":"stat","args":` + strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40) + `}`,
		"negative fence":         strings.Replace(ok, `"id":7`, `"id":7,"fence":-1`, 1),
		"string fence":           strings.Replace(ok, `"id":7`, `"id":7,"fence":"7"`, 1),
		"float fence":            strings.Replace(ok, `"id":7`, `"id":7,"fence":7.5`, 1),
		"fence over uint64":      strings.Replace(ok, `"id":7`, `"id":7,"fence":18446744073709551616`, 1),
		"duplicate fence":        strings.Replace(ok, `"id":7`, `"id":7,"fence":9,"fence":7`, 1),
		"case-folded fence":      strings.Replace(ok, `"id":7`, `"id":7,"Fence":9`, 1),
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			req, err := DecodeRequest([]byte(payload))
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrMalformed or ErrProtocol", err)
			}
			if req != nil {
				t.Fatalf("a fatal fault returned a request to answer: %+v", req)
			}
		})
	}
}

// Semantic faults are answered CodeInvalid with the request (to know its
// id); the connection stays up.
func TestDecodeRequestRefusesFields(t *testing.T) {
	ok := string(envelope("stat", `{"path":"x"}`))
	cases := map[string]string{
		"digest uppercase":     strings.Replace(ok, testDigest, strings.ToUpper(testDigest), 1),
		"digest short":         strings.Replace(ok, testDigest, testDigest[:63], 1),
		"op key empty":         strings.Replace(ok, `"op_key":"k1"`, `"op_key":""`, 1),
		"op key slash":         strings.Replace(ok, `"op_key":"k1"`, `"op_key":"a/b"`, 1),
		"op key long":          strings.Replace(ok, `"op_key":"k1"`, `"op_key":"`+strings.Repeat("k", 129)+`"`, 1),
		"deadline zero":        strings.Replace(ok, `"deadline":"2030-01-01T00:00:00Z",`, ``, 1),
		"empty path":           string(envelope("stat", `{"path":""}`)),
		"NUL path":             string(envelope("list", `{"path":"a\u0000b"}`)),
		"long path":            string(envelope("stat", `{"path":"`+strings.Repeat("a", MaxPathBytes+1)+`"}`)),
		"negative line":        string(envelope("read", `{"path":"x","line":-1}`)),
		"negative limit":       string(envelope("read", `{"path":"x","limit":-5}`)),
		"setuid mode":          string(envelope("write", `{"path":"x","content":"","mode":2541}`)),
		"bad expect digest":    string(envelope("write", `{"path":"x","content":"","expect_sha256":"zz"}`)),
		"expect both":          string(envelope("write", `{"path":"x","content":"","expect_sha256":"`+testDigest+`","expect_absent":true}`)),
		"hash none":            string(envelope("hash", `{"paths":[]}`)),
		"argv empty":           string(envelope("exec_start", `{"argv":[]}`)),
		"argv0 empty":          string(envelope("exec_start", `{"argv":[""]}`)),
		"argv NUL":             string(envelope("exec_start", `{"argv":["/bin/echo","a\u0000b"]}`)),
		"env name with =":      string(envelope("exec_start", `{"argv":["/bin/true"],"env":{"A=B":"1"}}`)),
		"env name empty":       string(envelope("exec_start", `{"argv":["/bin/true"],"env":{"":"1"}}`)),
		"output limit <0":      string(envelope("exec_start", `{"argv":["/bin/true"],"output_limit":-1}`)),
		"terminal id empty":    string(envelope("exec_wait", `{"terminal_id":""}`)),
		"terminal id too long": string(envelope("exec_kill", `{"terminal_id":"`+strings.Repeat("t", MaxTerminalID+1)+`"}`)),
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			req, err := DecodeRequest([]byte(payload))
			if codeOf(err) != errcode.CodeInvalid {
				t.Fatalf("err = %v, want CodeInvalid", err)
			}
			if req == nil || req.ID != 7 {
				t.Fatalf("request not returned for the answer: %+v", req)
			}
		})
	}
}

func TestDecodeArgsTypes(t *testing.T) {
	cases := []struct {
		op   Op
		raw  string
		want any
	}{
		{OpAttach, `{}`, &AttachArgs{}},
		{OpRead, `{"path":"f"}`, &ReadArgs{Path: "f"}},
		{OpWrite, `{"path":"f","content":"hi","mode":384,"expect_absent":true}`,
			&WriteArgs{Path: "f", Content: "hi", Mode: 0o600, ExpectAbsent: true}},
		{OpStat, `{"path":"f"}`, &StatArgs{Path: "f"}},
		{OpList, `{"path":"."}`, &ListArgs{Path: "."}},
		{OpHash, `{"paths":["a","b"]}`, &HashArgs{Paths: []string{"a", "b"}}},
		{OpExecStart, `{"argv":["/bin/sh","-c","true"],"cwd":"w","env":{"PATH":"/bin"},"output_limit":10,"hash_after_exit":["o"]}`,
			&ExecStartArgs{Argv: []string{"/bin/sh", "-c", "true"}, Cwd: "w", Env: map[string]string{"PATH": "/bin"},
				OutputLimit: new(int64(10)), HashAfterExit: []string{"o"}}},
		{OpExecStart, `{"argv":["sh"],"output_limit":0}`, &ExecStartArgs{Argv: []string{"sh"}, OutputLimit: new(int64(0))}},
		{OpExecOutput, `{"terminal_id":"t1"}`, &TerminalArgs{TerminalID: "t1"}},
		{OpExecWait, `{"terminal_id":"t1"}`, &TerminalArgs{TerminalID: "t1"}},
		{OpExecKill, `{"terminal_id":"t1"}`, &TerminalArgs{TerminalID: "t1"}},
		{OpExecRelease, `{"terminal_id":"t1"}`, &TerminalArgs{TerminalID: "t1"}},
		{OpExecWait, `{"terminal_id":"t1","release":true}`, &TerminalArgs{TerminalID: "t1", Release: true}},
		{OpReadChunk, `{"path":"f","offset":5,"length":10}`, &ReadChunkArgs{Path: "f", Offset: 5, Length: 10}},
		{OpWriteBegin, `{"path":"f","size":3,"sha256":"` + strings.Repeat("a", 64) + `","mode":420}`,
			&WriteBeginArgs{Path: "f", Size: 3, SHA256: strings.Repeat("a", 64), Mode: 0o644}},
		{OpWriteChunk, `{"transfer_id":"w-1","offset":0,"data":"YWJj"}`, &WriteChunkArgs{TransferID: "w-1", Data: []byte("abc")}},
		{OpWriteCommit, `{"transfer_id":"w-1"}`, &TransferArgs{TransferID: "w-1"}},
		{OpWriteAbort, `{"transfer_id":"w-1"}`, &TransferArgs{TransferID: "w-1"}},
	}
	seen := map[Op]bool{}
	for _, c := range cases {
		seen[c.op] = true
		got, err := DecodeArgs(c.op, []byte(c.raw))
		if err != nil {
			t.Errorf("%s: %v", c.op, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %#v, want %#v", c.op, got, c.want)
		}
	}
	for _, op := range Ops {
		if !seen[op] {
			t.Errorf("op %s has no decode case", op)
		}
	}
	if _, err := DecodeArgs("rm", []byte(`{}`)); !errors.Is(err, ErrProtocol) {
		t.Errorf("unknown op: %v", err)
	}
}

func TestDecodeResponse(t *testing.T) {
	good := []string{
		`{"id":1,"result":{}}`,
		`{"id":1,"error":{"code":"denied","message":"no"}}`,
		`{"id":0,"error":{"code":"unavailable","message":"shutting down"}}`,
	}
	for _, g := range good {
		if _, err := DecodeResponse([]byte(g)); err != nil {
			t.Errorf("%s: %v", g, err)
		}
	}
	bad := []string{
		`{"id":1}`,
		`{"id":1,"result":null}`,
		`{"id":1,"result":{},"error":{"code":"denied","message":"x"}}`,
		`{"id":1,"error":{"code":"made_up","message":"x"}}`,
		`{"id":1,"error":{"code":"denied","message":"x","detail":1}}`,
		`{"id":0,"result":{}}`,
		`{"id":1,"result":{},"id":2}`,
		`{"id":1,"result":{}} {}`,
	}
	for _, b := range bad {
		if _, err := DecodeResponse([]byte(b)); !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: err = %v, want a fatal fault", b, err)
		}
	}
}

func TestValidOpKeyAndDigest(t *testing.T) {
	for _, k := range []string{"a", "A-z_0.9:x", strings.Repeat("k", MaxOpKeyBytes)} {
		if !ValidOpKey(k) {
			t.Errorf("ValidOpKey(%q) = false", k)
		}
	}
	for _, k := range []string{"", "a b", "a/b", "é", strings.Repeat("k", MaxOpKeyBytes+1)} {
		if ValidOpKey(k) {
			t.Errorf("ValidOpKey(%q) = true", k)
		}
	}
	if !ValidDigest(testDigest) || ValidDigest(strings.ToUpper(testDigest)) || ValidDigest(testDigest+"0") {
		t.Error("ValidDigest wrong")
	}
}
