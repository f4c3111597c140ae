package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/tetherdev/tether/plugin/contract"
)

// Plugin is a running, verified tether-plugin process. Close kills it.
type Plugin struct {
	client *goplugin.Client
	impl   contract.Plugin

	closeOnce sync.Once
}

// Load verifies that the binary at path has the given SHA-256 (lowercase
// or uppercase hex), then starts it with go-plugin: gRPC only, AutoMTLS, the
// versioned handshake, SecureConfig, and an environment built from nothing
// (the host's environment is not inherited). The bytes that run are a
// sealed in-memory copy of the bytes that were hashed. ctx bounds the
// start; the plugin lives until Close.
func Load(ctx context.Context, path, sha256Hex string, opts ...Option) (*Plugin, error) {
	o := options{startTimeout: 30 * time.Second, versions: contract.ProtocolVersions}
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
	return &Plugin{client: client, impl: impl}, nil
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
		HandshakeConfig:  contract.Handshake,
		VersionedPlugins: contract.PluginSets(o.versions, nil),
		Cmd:              cmd,
		SecureConfig:     &goplugin.SecureConfig{Checksum: want, Hash: sha256.New()},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		GRPCDialOptions:  contract.DialOptions(),
		SkipHostEnv:      true,
		StartTimeout:     o.startTimeout,
		Stderr:           stderr,
		Logger:           logger,
	}
}

// start runs the handshake and dispenses the plugin, giving up when ctx
// ends (go-plugin's Client has no ctx; the caller kills on error).
func start(ctx context.Context, client *goplugin.Client) (*contract.PluginClient, error) {
	type result struct {
		impl *contract.PluginClient
		err  error
	}
	done := make(chan result, 1)
	go func() {
		rpc, err := client.Client()
		if err != nil {
			done <- result{err: err}
			return
		}
		raw, err := rpc.Dispense(contract.PluginName)
		if err != nil {
			done <- result{err: err}
			return
		}
		impl, ok := raw.(*contract.PluginClient)
		if !ok {
			done <- result{err: fmt.Errorf("dispensed %T, want *contract.PluginClient", raw)}
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

// Close kills the plugin process. Every binding the plugin held is gone
// with it; hosts must not restart the plugin behind their sessions' backs
// (sessions then reattach). Safe to call twice.
func (p *Plugin) Close() error {
	p.closeOnce.Do(p.client.Kill)
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
