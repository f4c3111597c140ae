// Package host is what a Go agent runtime imports to use tether-plugin:
// Load starts and verifies the plugin; Plugin.Connect hands it one ACP
// agent-side connection; Conn reports sessions, asks the ToolPolicy and runs
// the tools. docs/plugin.md shows a host in fifteen lines.
package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/tetherdev/tether/plugin/shared"
)

// Errors Load returns; callers branch on them with errors.Is.
var (
	// ErrChecksum: the binary's SHA-256 is not the expected one (see
	// *ChecksumError) or the expected value is malformed.
	ErrChecksum = errors.New("plugin checksum")
	// ErrStart: the plugin did not complete the handshake (wrong versions,
	// no mutual TLS, crash, timeout); the error carries its stderr.
	ErrStart = errors.New("plugin start")
)

// ChecksumError names the path and both digests.
type ChecksumError struct {
	Path, Want, Got string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("plugin checksum: %s has SHA-256 %s, want %s", e.Path, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrChecksum) true.
func (e *ChecksumError) Is(target error) bool { return target == ErrChecksum }

// Option configures Load.
type Option func(*options)

type options struct {
	args         []string
	stderr       io.Writer
	logger       hclog.Logger
	startTimeout time.Duration
	versions     []int
	cancelGrace  time.Duration
}

// WithArgs passes arguments to the plugin binary.
func WithArgs(args ...string) Option { return func(o *options) { o.args = args } }

// WithStderr copies the plugin's raw stderr (its JSON log) to w.
func WithStderr(w io.Writer) Option { return func(o *options) { o.stderr = w } }

// WithLogger sets go-plugin's logger (default: errors to os.Stderr).
func WithLogger(l hclog.Logger) Option { return func(o *options) { o.logger = l } }

// WithStartTimeout bounds the handshake (default 30 s).
func WithStartTimeout(d time.Duration) Option { return func(o *options) { o.startTimeout = d } }

// WithCancelGrace bounds how long a cancelled tool call waits for the
// plugin's answer (default DefaultCancelGrace); past it the call returns
// ErrCancelUnconfirmed.
func WithCancelGrace(d time.Duration) Option { return func(o *options) { o.cancelGrace = d } }

// Plugin is a running, verified tether-plugin process. Close kills it.
type Plugin struct {
	client      *goplugin.Client
	impl        *shared.PluginClient
	cancelGrace time.Duration

	closeOnce sync.Once
}

// Load verifies that the binary at path has the given SHA-256 (lowercase
// or uppercase hex), then starts it with go-plugin: gRPC only, AutoMTLS, the
// versioned handshake, SecureConfig, and an environment built from nothing
// (the host's environment is not inherited). The bytes that run are a
// sealed in-memory copy of the bytes that were hashed. ctx bounds the
// start; the plugin lives until Close.
func Load(ctx context.Context, path, sha256Hex string, opts ...Option) (*Plugin, error) {
	o := options{startTimeout: 30 * time.Second, versions: shared.ProtocolVersions, cancelGrace: DefaultCancelGrace}
	for _, opt := range opts {
		opt(&o)
	}
	want, err := hex.DecodeString(sha256Hex)
	if err != nil || len(want) != sha256.Size {
		return nil, fmt.Errorf("%w: expected SHA-256 %q is not 64 hex digits", ErrChecksum, sha256Hex)
	}
	exe, err := sealedCopy(path, want)
	if err != nil {
		return nil, err
	}
	defer exe.Close() // the child has exec'd it once Start returns
	tail := &tailBuffer{max: 8 << 10}
	client := goplugin.NewClient(clientConfig(o, exe, want, tail))
	impl, err := start(ctx, client)
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("%w: %v; the host speaks protocol versions %v; plugin stderr: %q",
			ErrStart, err, o.versions, tail.String())
	}
	return &Plugin{client: client, impl: impl, cancelGrace: o.cancelGrace}, nil
}

func clientConfig(o options, exe *os.File, want []byte, tail *tailBuffer) *goplugin.ClientConfig {
	logger := o.logger
	if logger == nil {
		logger = hclog.New(&hclog.LoggerOptions{Name: "tether-plugin", Level: hclog.Error, Output: os.Stderr})
	}
	var stderr io.Writer = tail
	if o.stderr != nil {
		stderr = io.MultiWriter(tail, o.stderr)
	}
	cmd := &exec.Cmd{Path: execPath(exe), Args: append([]string{"tether-plugin"}, o.args...), Env: []string{}}
	return &goplugin.ClientConfig{
		HandshakeConfig:  shared.Handshake,
		VersionedPlugins: shared.PluginSets(o.versions, nil),
		Cmd:              cmd,
		SecureConfig:     &goplugin.SecureConfig{Checksum: want, Hash: sha256.New()},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		GRPCDialOptions:  shared.DialOptions(),
		SkipHostEnv:      true,
		StartTimeout:     o.startTimeout,
		Stderr:           stderr,
		Logger:           logger,
	}
}

// start runs the handshake and dispenses the plugin, giving up when ctx
// ends (go-plugin's Client has no ctx; the caller kills on error).
func start(ctx context.Context, client *goplugin.Client) (*shared.PluginClient, error) {
	type result struct {
		impl *shared.PluginClient
		err  error
	}
	done := make(chan result, 1)
	go func() {
		rpc, err := client.Client()
		if err != nil {
			done <- result{err: err}
			return
		}
		raw, err := rpc.Dispense(shared.PluginName)
		if err != nil {
			done <- result{err: err}
			return
		}
		impl, ok := raw.(*shared.PluginClient)
		if !ok {
			done <- result{err: fmt.Errorf("dispensed %T, want *shared.PluginClient", raw)}
			return
		}
		done <- result{impl: impl}
	}()
	select {
	case r := <-done:
		return r.impl, r.err
	case <-ctx.Done():
		client.Kill()
		<-done
		return nil, ctx.Err()
	}
}

// Close stops every broker stream and kills the plugin process. Every
// binding the plugin held is gone with it; hosts must not restart the
// plugin behind their sessions' backs (sessions then reattach). Safe to
// call twice.
func (p *Plugin) Close() error {
	p.closeOnce.Do(func() {
		_ = p.impl.Close()
		p.client.Kill()
	})
	return nil
}

// Exited reports whether the plugin process has exited.
func (p *Plugin) Exited() bool { return p.client.Exited() }

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf.Bytes()))
}
