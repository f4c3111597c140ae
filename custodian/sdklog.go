package custodian

import (
	"context"
	"io"
	"log/slog"
)

// sdkLogger routes acp-go-sdk's connection diagnostics through the
// custodian's logger (Options.Logger), never slog.Default. The SDK logs
// routine events at Info ("connection closed" whenever an agent exits),
// so records below Warn become Debug: a normal run stays quiet, and
// warnings and errors (a line that is not JSON-RPC, a dropped
// notification) keep their level.
func sdkLogger(l *slog.Logger) *slog.Logger {
	return slog.New(sdkHandler{l.Handler()}).With("component", "acp-go-sdk")
}

// sdkHandler demotes records below Warn to Debug.
type sdkHandler struct{ h slog.Handler }

var _ slog.Handler = sdkHandler{}

func sdkLevel(l slog.Level) slog.Level {
	if l < slog.LevelWarn {
		return slog.LevelDebug
	}
	return l
}

// Enabled reports whether the demoted level is enabled.
func (s sdkHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return s.h.Enabled(ctx, sdkLevel(l))
}

// Handle passes the record on at its demoted level.
func (s sdkHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = sdkLevel(r.Level)
	return s.h.Handle(ctx, r)
}

// WithAttrs keeps the demotion.
func (s sdkHandler) WithAttrs(as []slog.Attr) slog.Handler { return sdkHandler{s.h.WithAttrs(as)} }

// WithGroup keeps the demotion.
func (s sdkHandler) WithGroup(name string) slog.Handler { return sdkHandler{s.h.WithGroup(name)} }

// gatedReader blocks reads until open is closed.
type gatedReader struct {
	r    io.Reader
	open chan struct{}
}

// Read waits for the gate, then reads.
func (g *gatedReader) Read(p []byte) (int, error) {
	<-g.open
	return g.r.Read(p)
}
