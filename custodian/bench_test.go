package custodian

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/receiver/wire"
)

// directClient is the same ACP client with custody disabled: it forwards
// each callback straight to the receiver, with no binding checks, no
// operation keys and no audit. It is the baseline of the benchmarks.
type directClient struct {
	acp.Client // nil: only the methods below are benchmarked
	conn       ReceiverConn
	digest     string
	root       string
}

func (d *directClient) call(ctx context.Context, op wire.Op, args, res any) error {
	return d.conn.Call(ctx, op, d.digest, newKey("direct"), time.Now().Add(time.Minute), args, res)
}

func (d *directClient) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	var res wire.ReadResult
	err := d.call(ctx, wire.OpRead, &wire.ReadArgs{Path: strings.TrimPrefix(p.Path, d.root+"/")}, &res)
	return acp.ReadTextFileResponse{Content: res.Content}, err
}

func (d *directClient) CreateTerminal(ctx context.Context, p acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	var res wire.ExecStartResult
	err := d.call(ctx, wire.OpExecStart, &wire.ExecStartArgs{Argv: append([]string{p.Command}, p.Args...), Cwd: "."}, &res)
	return acp.CreateTerminalResponse{TerminalId: res.TerminalID}, err
}

func (d *directClient) WaitForTerminalExit(ctx context.Context, p acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	var res wire.ExecWaitResult
	err := d.call(ctx, wire.OpExecWait, &wire.TerminalArgs{TerminalID: p.TerminalId}, &res)
	return acp.WaitForTerminalExitResponse{ExitCode: res.Exit.ExitCode}, err
}

func (d *directClient) TerminalOutput(ctx context.Context, p acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	var res wire.ExecOutputResult
	err := d.call(ctx, wire.OpExecOutput, &wire.TerminalArgs{TerminalID: p.TerminalId}, &res)
	return acp.TerminalOutputResponse{Output: res.Output, Truncated: res.Truncated}, err
}

func (d *directClient) ReleaseTerminal(ctx context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, d.call(ctx, wire.OpExecRelease, &wire.TerminalArgs{TerminalID: p.TerminalId}, nil)
}

// benchAgent returns the agent side of an ACP connection whose client is
// either the custodian (bound and attached) or the direct baseline.
func benchAgent(b *testing.B, rr *realReceiver, custody bool) *acp.AgentSideConnection {
	b.Helper()
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	agent := &testAgent{sessionID: "sess-bench", attachOnNew: true}
	g := &testagent.Gate{R: c2aR, Ready: make(chan struct{})}
	agent.conn = acp.NewAgentSideConnection(agent, a2cW, g)
	close(g.Ready)
	b.Cleanup(func() { c2aW.Close(); a2cW.Close() })
	if !custody {
		conn, err := rr.dialer()(context.Background())
		must(b, err)
		b.Cleanup(func() { conn.Close() })
		acp.NewClientSideConnection(&directClient{conn: conn, digest: rr.tuple.SHA256(), root: rr.tuple.Root}, c2aW, a2cR)
		return agent.conn
	}
	skey, _, err := audit.GenerateKey("tether.bench/custodian")
	must(b, err)
	c, err := New(Options{StateDir: filepath.Join(b.TempDir(), "state"), AuditKey: []byte(skey)})
	must(b, err)
	recv := NewReceiver(rr.dialer(), Backoff{}, nil)
	conn := c.Serve(c2aW, a2cR, ConnOptions{})
	b.Cleanup(func() { conn.Close(); recv.Close(); c.Close() })
	ctx := context.Background()
	_, err = conn.Initialize(ctx)
	must(b, err)
	_, err = conn.NewSession(ctx, acp.NewSessionRequest{Cwd: rr.tuple.Root, McpServers: []acp.McpServer{}},
		Binding{Tuple: rr.tuple, LeaseNotAfter: time.Now().Add(time.Hour), Principal: "alice", Receiver: recv})
	must(b, err)
	if agent.attachErr != nil {
		b.Fatal(agent.attachErr)
	}
	return agent.conn
}

func benchMeta(rr *realReceiver, key string) map[string]any {
	return acpmeta.Op{TupleSHA256: rr.tuple.SHA256(), OpKey: key, Deadline: time.Now().Add(time.Minute)}.Meta()
}

// BenchmarkIntegrationRead4KiB: fs/read_text_file of a 4 KiB file through
// a real receiver process, with custody and with custody disabled (the
// ratio custody/direct is the custodian's added cost).
func BenchmarkIntegrationRead4KiB(b *testing.B) {
	rr := startReceiver(b)
	must(b, os.WriteFile(rr.file("4k.txt"), []byte(strings.Repeat("0123456789abcde\n", 256)), 0o644))
	for _, custody := range []bool{false, true} {
		b.Run(map[bool]string{false: "direct", true: "custody"}[custody], func(b *testing.B) {
			a := benchAgent(b, rr, custody)
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				r, err := a.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: "sess-bench", Path: rr.file("4k.txt"), Meta: benchMeta(rr, fmt.Sprintf("r%d", i))})
				if err != nil || len(r.Content) != 4096 {
					b.Fatalf("read: %d bytes, %v", len(r.Content), err)
				}
			}
		})
	}
}

// BenchmarkIntegrationExec: what tether-plugin's run_command sends for
// /bin/true (terminal/create, wait_for_exit, output, release) through a
// real receiver process, with and without custody.
func BenchmarkIntegrationExec(b *testing.B) {
	rr := startReceiver(b)
	for _, custody := range []bool{false, true} {
		b.Run(map[bool]string{false: "direct", true: "custody"}[custody], func(b *testing.B) {
			a := benchAgent(b, rr, custody)
			ctx := context.Background()
			run := newKey("b") // op keys stay unique across -count runs on one receiver
			for i := 0; b.Loop(); i++ {
				t, err := a.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: "sess-bench", Command: "/bin/true",
					Cwd: &rr.tuple.Root, Meta: benchMeta(rr, fmt.Sprintf("%s-%d:create", run, i))})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := a.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: "sess-bench", TerminalId: t.TerminalId,
					Meta: benchMeta(rr, fmt.Sprintf("%s-%d:wait", run, i))}); err != nil {
					b.Fatal(err)
				}
				if _, err := a.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: "sess-bench", TerminalId: t.TerminalId,
					Meta: benchMeta(rr, fmt.Sprintf("%s-%d:output", run, i))}); err != nil {
					b.Fatal(err)
				}
				if _, err := a.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: "sess-bench", TerminalId: t.TerminalId,
					Meta: benchMeta(rr, fmt.Sprintf("%s-%d:release", run, i))}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
