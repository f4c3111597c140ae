package contract

import "google.golang.org/grpc"

// ServerOptions returns the options every plugin-side and host-side gRPC
// server of this contract uses, after the given ones (go-plugin's TLS).
func ServerOptions(opts ...grpc.ServerOption) []grpc.ServerOption {
	return append(opts, grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes))
}

// DialOptions returns the options every gRPC client of this contract uses.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes))}
}
