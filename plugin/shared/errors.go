package shared

import (
	"context"
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
// lost ACP connection is UNAVAILABLE; a call refused because its tool
// call's caller cancelled is CANCELLED.
func acpErrorStatus(ctx context.Context, err error) error {
	var re *acp.RequestError
	switch {
	case errors.Is(err, ErrTransport):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, ErrCancelled):
		return status.Error(codes.Canceled, err.Error())
	case errors.As(err, &re):
		st, dErr := status.New(codes.Aborted, re.Message).WithDetails(jsonRPCErrorPB(re))
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
// detail becomes the identical *acp.RequestError; the plugin's own
// cancellation stays a context error; CANCELLED from the host (its caller
// cancelled the tool call) wraps ErrCancelled; anything else means the ACP
// connection or the broker is gone and wraps ErrTransport.
func acpErrorFromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if je, ok := d.(*pb.JsonRpcError); ok {
			return jsonRPCErrorFromPB(je)
		}
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("acp call: %w", ctx.Err())
	case st.Code() == codes.Canceled:
		return fmt.Errorf("%w: the host refused the acp call: %s", ErrCancelled, st.Message())
	}
	return fmt.Errorf("%w: acp call: %s", ErrTransport, st.Message())
}

// toolErrorStatus turns a Plugin method failure into a gRPC status with a
// ToolError detail carrying the tether code; a cancelled call (ErrCancelled
// or the plugin's own context) is CANCELLED.
func toolErrorStatus(err error) error {
	if _, ok := acpmeta.CodeOf(err); !ok {
		switch {
		case errors.Is(err, ErrCancelled):
			return status.Error(codes.Canceled, err.Error())
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
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
// a *wire.Error (acpmeta.CodeOf reads it); CANCELLED (the plugin finished a
// call its caller cancelled) wraps ErrCancelled; the host's own abandoning
// of the call stays a context error; anything else means the plugin is
// unreachable.
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
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("plugin call: %w", context.Cause(ctx))
	case st.Code() == codes.Canceled:
		return fmt.Errorf("%w: %s", ErrCancelled, st.Message())
	case st.Code() == codes.DeadlineExceeded:
		return fmt.Errorf("plugin call: %s", st.Message())
	}
	return fmt.Errorf("%w: plugin call: %s", ErrTransport, st.Message())
}
