package contract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	acp "github.com/coder/acp-go-sdk"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	pb "github.com/tetherdev/tether/plugin/proto"
)

// MaxMessageBytes bounds one gRPC message in either direction (a plan
// carries a whole file to write).
const MaxMessageBytes = 16 << 20

// toolErrorStatus turns a Plugin method failure into a gRPC status with a
// ToolError detail carrying the tether code; the plugin's own context
// ending (the host abandoned the call) stays a context status.
func toolErrorStatus(err error) error {
	code, ok := acperr.CodeOf(err)
	if !ok && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return status.FromContextError(err).Err()
	}
	if !ok {
		code = errcode.CodeInternal
	}
	msg := err.Error()
	var we *errcode.Error
	if errors.As(err, &we) {
		msg = we.Message
	}
	st, dErr := status.New(codes.FailedPrecondition, msg).WithDetails(&pb.ToolError{Code: string(code), Message: msg})
	if dErr != nil {
		return status.Error(codes.Internal, "encode tool error: "+dErr.Error())
	}
	return st.Err()
}

// toolErrorFromStatus is the inverse on the host side: a ToolError becomes
// a *errcode.Error (acperr.CodeOf reads it; a code outside the closed set is
// internal); the host's own abandoning of the call stays a context error;
// anything else means the plugin is unreachable (ErrTransport).
func toolErrorFromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if te, ok := d.(*pb.ToolError); ok {
			code := errcode.Code(te.GetCode())
			if !code.Valid() {
				code = errcode.CodeInternal
			}
			return &errcode.Error{Code: code, Message: te.GetMessage()}
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("plugin call: %w", context.Cause(ctx))
	}
	return fmt.Errorf("%w: plugin call: %s", ErrTransport, st.Message())
}

func jsonRPCErrorPB(re *acp.RequestError) *pb.JsonRpcError {
	var data []byte
	if re.Data != nil {
		data, _ = json.Marshal(re.Data)
	}
	return &pb.JsonRpcError{Code: int32(re.Code), Message: re.Message, DataJson: data}
}

func jsonRPCErrorFromPB(je *pb.JsonRpcError) *acp.RequestError {
	re := &acp.RequestError{Code: int(je.GetCode()), Message: je.GetMessage()}
	if len(je.GetDataJson()) > 0 {
		var data any
		if json.Unmarshal(je.GetDataJson(), &data) == nil {
			re.Data = data
		}
	}
	return re
}
