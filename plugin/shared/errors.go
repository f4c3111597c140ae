package shared

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	acp "github.com/coder/acp-go-sdk"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherdev/tether/custodian/acpmeta"
	pb "github.com/tetherdev/tether/plugin/proto"
	"github.com/tetherdev/tether/receiver/wire"
)

// MaxMessageBytes bounds one gRPC message in either direction (a file read
// or a command's output travels whole in one message).
const MaxMessageBytes = 16 << 20

// acpErrorStatus turns an ACPClient failure into the gRPC status the host
// sends back: a JSON-RPC error travels intact in a JsonRpcError detail; a
// lost ACP connection is UNAVAILABLE.
func acpErrorStatus(ctx context.Context, err error) error {
	var re *acp.RequestError
	switch {
	case errors.Is(err, ErrTransport):
		return status.Error(codes.Unavailable, err.Error())
	case errors.As(err, &re):
		data, mErr := json.Marshal(re.Data)
		if mErr != nil || re.Data == nil {
			data = nil
		}
		st, dErr := status.New(codes.Aborted, re.Message).WithDetails(
			&pb.JsonRpcError{Code: int32(re.Code), Message: re.Message, DataJson: data})
		if dErr != nil {
			return status.Error(codes.Internal, "encode json-rpc error: "+dErr.Error())
		}
		return st.Err()
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	default:
		return status.Error(codes.Internal, err.Error())
	}
}

// acpErrorFromStatus is the inverse on the plugin side. A JsonRpcError
// detail becomes the identical *acp.RequestError; the caller's own
// cancellation stays a context error; anything else means the ACP
// connection or the broker is gone and wraps ErrTransport.
func acpErrorFromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if je, ok := d.(*pb.JsonRpcError); ok {
			re := &acp.RequestError{Code: int(je.GetCode()), Message: je.GetMessage()}
			if len(je.GetDataJson()) > 0 {
				var data any
				if json.Unmarshal(je.GetDataJson(), &data) == nil {
					re.Data = data
				}
			}
			return re
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("acp call: %w", ctx.Err())
	}
	return fmt.Errorf("%w: acp call: %s", ErrTransport, st.Message())
}

// toolErrorStatus turns a Plugin method failure into a gRPC status with a
// ToolError detail carrying the tether code.
func toolErrorStatus(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if _, ok := acpmeta.CodeOf(err); !ok {
			return status.FromContextError(err).Err()
		}
	}
	code, ok := acpmeta.CodeOf(err)
	if !ok {
		code = wire.CodeInternal
	}
	msg := err.Error()
	var we *wire.Error
	if errors.As(err, &we) {
		msg = we.Message
	}
	st, dErr := status.New(codes.FailedPrecondition, msg).WithDetails(
		&pb.ToolError{Code: string(code), Message: msg})
	if dErr != nil {
		return status.Error(codes.Internal, "encode tool error: "+dErr.Error())
	}
	return st.Err()
}

// toolErrorFromStatus is the inverse on the host side: a ToolError becomes
// a *wire.Error (acpmeta.CodeOf reads it); the caller's cancellation stays a
// context error; anything else means the plugin is unreachable.
func toolErrorFromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if te, ok := d.(*pb.ToolError); ok {
			code := wire.Code(te.GetCode())
			if !code.Valid() {
				code = wire.CodeInternal
			}
			return &wire.Error{Code: code, Message: te.GetMessage()}
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("plugin call: %w", ctx.Err())
	}
	if st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded {
		return fmt.Errorf("plugin call: %s", st.Message())
	}
	return fmt.Errorf("%w: plugin call: %s", ErrTransport, st.Message())
}
