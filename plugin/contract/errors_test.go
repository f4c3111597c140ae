package contract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	acp "github.com/coder/acp-go-sdk"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/admission/strictjson"
	pb "github.com/tetherdev/tether/plugin/proto"
)

// TestJSONRPCErrorSurvivesTheHop: the custodian's answer to
// `_tether/attach`, data and all, arrives at the plugin identical to what
// a JSON decode of the wire gives the host.
func TestJSONRPCErrorSurvivesTheHop(t *testing.T) {
	orig := acperr.NewError(errcode.CodeTupleMismatch, "digest %s is not the binding's", "abc")
	orig.Data.(map[string]any)["extra"] = []any{1.5, "x", map[string]any{"k": true}}
	// What the host holds: the error as acp-go-sdk decoded it off the wire.
	b, _ := json.Marshal(orig)
	var onWire acp.RequestError
	if err := json.Unmarshal(b, &onWire); err != nil {
		t.Fatal(err)
	}
	_, got := attachResultFromPB(attachResultPB(nil, &onWire))
	var re *acp.RequestError
	if !errors.As(got, &re) || re.Code != onWire.Code || re.Message != onWire.Message || !reflect.DeepEqual(re.Data, onWire.Data) {
		t.Fatalf("after the hop: %#v, want %#v", got, &onWire)
	}
	if code, ok := acperr.CodeOf(got); !ok || code != errcode.CodeTupleMismatch {
		t.Fatalf("CodeOf after the hop = %q %v", code, ok)
	}
	raw, err := attachResultFromPB(attachResultPB(json.RawMessage(`{"grant_generation":3}`), nil))
	if err != nil || string(raw) != `{"grant_generation":3}` {
		t.Fatalf("result after the hop: %s %v", raw, err)
	}
}

// TestTransportLossIsNotAPeerError: a lost ACP connection during attach
// (or an empty answer) reaches the plugin as ErrTransport, never as the
// client's refusal.
func TestTransportLossIsNotAPeerError(t *testing.T) {
	for _, r := range []*pb.AttachResult{attachResultPB(nil, fmt.Errorf("%w: closed", ErrTransport)),
		attachResultPB(nil, errors.New("pipe broke")), {}} {
		_, got := attachResultFromPB(r)
		var re *acp.RequestError
		if !errors.Is(got, ErrTransport) || errors.As(got, &re) {
			t.Errorf("%v -> %v, want ErrTransport and no RequestError", r, got)
		}
	}
	for _, err := range []error{status.Error(codes.Unavailable, "connection refused"), status.Error(codes.Internal, "boom")} {
		if got := toolErrorFromStatus(context.Background(), err); !errors.Is(got, ErrTransport) {
			t.Errorf("plugin call %v -> %v, want ErrTransport", err, got)
		}
	}
}

func TestToolErrorSurvivesTheHop(t *testing.T) {
	ctx := context.Background()
	got := toolErrorFromStatus(ctx, toolErrorStatus(errcode.Errorf(errcode.CodeFenced, "session %q is fenced", "s1")))
	var we *errcode.Error
	if !errors.As(got, &we) || we.Code != errcode.CodeFenced || we.Message != `session "s1" is fenced` {
		t.Fatalf("tool error after the hop: %v", got)
	}
	bogus, _ := status.New(codes.FailedPrecondition, "x").WithDetails(&pb.ToolError{Code: "made_up", Message: "x"})
	if code, _ := acperr.CodeOf(toolErrorFromStatus(ctx, bogus.Err())); code != errcode.CodeInternal {
		t.Fatalf("a code outside the closed set became %q", code)
	}
}

// TestMetaFromJSONOneReading: a `_meta` naming tether/bind twice (also
// through an escape), or a key twice inside the bind value, is refused; a
// reader keeping the first and one keeping the last would bind different
// tuples.
func TestMetaFromJSONOneReading(t *testing.T) {
	for _, in := range []string{
		`{"tether/bind":{"tuple":{}},"tether/bind":{"tuple":{}}}`,
		`{"tether/bind":{"tuple":{}},"tether\u002fbind":{"tuple":{}}}`,
		`{"tether/bind":{"tuple":{"owner":"a","owner":"b"}}}`,
		`{"tether/bind":{}} {}`,
	} {
		if m, err := MetaFromJSON([]byte(in)); !errors.Is(err, acpmeta.ErrMeta) || !errors.Is(err, strictjson.ErrInvalid) || m != nil {
			t.Errorf("%s: %v, %v; want a strict refusal wrapping acpmeta.ErrMeta", in, m, err)
		}
	}
	for _, in := range []string{``, `null`, ` null `, `{}`} {
		if _, err := MetaFromJSON([]byte(in)); err != nil {
			t.Errorf("%q: %v", in, err)
		}
	}
}

// FuzzMetaFromJSON: anything that decodes is a JSON object; nothing panics.
func FuzzMetaFromJSON(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := MetaFromJSON(b)
		if err != nil {
			if !errors.Is(err, acpmeta.ErrMeta) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if _, _, err := acpmeta.BindFromMeta(m); err != nil && !errors.Is(err, acpmeta.ErrMeta) {
			t.Fatalf("BindFromMeta untyped error %v", err)
		}
	})
}

// TestCancelIsNeitherTransportNorTool: a plugin call its caller abandoned
// is the caller's context error on the host, never ErrTransport (the
// plugin being gone) nor a tool refusal; on the plugin side its own
// context ending is a context status, not a ToolError.
func TestCancelIsNeitherTransportNorTool(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	got := toolErrorFromStatus(cancelled, status.Error(codes.Canceled, "context canceled"))
	if _, coded := acperr.CodeOf(got); !errors.Is(got, context.Canceled) || coded || errors.Is(got, ErrTransport) {
		t.Fatalf("abandoned plugin call at the host: %v", got)
	}
	st, _ := status.FromError(toolErrorStatus(fmt.Errorf("authorize: %w", context.Canceled)))
	if st.Code() != codes.Canceled || len(st.Details()) != 0 {
		t.Fatalf("the plugin's own cancel: %v", st)
	}
}

// TestPeerMessage: the client's own message, not the JSON-RPC error as text.
func TestPeerMessage(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{acperr.NewError(errcode.CodeNotAdmitted, "no grant covers %s", "x"), "no grant covers x"},
		{fmt.Errorf("wrapped: %w", acperr.NewError(errcode.CodeFenced, "f")), "f"},
		{acp.NewInternalError(map[string]any{"error": "boom"}), "JSON-RPC error -32603: Internal error (boom)"},
		{&acp.RequestError{Code: 1, Message: "m", Data: map[string]any{"message": "not tether"}}, "JSON-RPC error 1: m"},
		{errcode.Errorf(errcode.CodeTimeout, "late"), "late"},
		{errors.New("plain"), "plain"},
	} {
		if got := PeerMessage(c.err); got != c.want {
			t.Errorf("PeerMessage(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
