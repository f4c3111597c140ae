package wire

import (
	"bytes"
	"encoding/json"
)

// argsMark is how the args field of an encoded request begins when its
// value is the placeholder 0: id is always encoded first, so the field
// follows a comma, and inside a JSON string a quote is always escaped, so
// the mark cannot occur within another field's value.
var argsMark = []byte(`,"args":0`)

// encodeRequest encodes req as json.Marshal would, but writes the envelope
// around req.Args (which json.Marshal made, so it is compact and valid)
// instead of encoding the envelope with the args inside: that would scan
// the args again byte by byte (a chunk's are a megabyte). The envelope is
// still encoded by json.Marshal, whatever fields Request has.
func encodeRequest(req *Request) ([]byte, error) {
	args := req.Args
	req.Args = json.RawMessage("0")
	env, err := json.Marshal(req)
	req.Args = args
	if err != nil {
		return nil, err
	}
	i := bytes.Index(env, argsMark)
	end := i + len(argsMark)
	if i < 0 || bytes.Index(env[end:], argsMark) >= 0 || end >= len(env) || (env[end] != ',' && env[end] != '}') {
		return json.Marshal(req) // not the shape expected: the slow, certain way
	}
	out := make([]byte, 0, len(env)+len(args))
	out = append(append(out, env[:end-1]...), args...)
	return append(out, env[end:]...), nil
}

// EncodeRequest is encodeRequest, for the client (receiver/wireclient).
func EncodeRequest(req *Request) ([]byte, error) { return encodeRequest(req) }
