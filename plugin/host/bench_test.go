package host_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/plugin/host"
	pb "github.com/tetherdev/tether/plugin/proto"
)

// BenchmarkLaunch: start + verify + handshake + dispense of the plugin,
// against a bare fork/exec of the same binary that exits at once (the
// floor every launch pays). Compare the two ns/op of one run.
func BenchmarkLaunch(b *testing.B) {
	path, sum := selfBinary(b)
	b.Run("exec-baseline", func(b *testing.B) {
		for b.Loop() {
			cmd := exec.Command(path, helperArg)
			cmd.Env = []string{}
			_ = cmd.Run() // exits 2: run by hand
		}
	})
	b.Run("load-handshake", func(b *testing.B) {
		ctx := context.Background()
		for b.Loop() {
			p, err := host.Load(ctx, path, sum, host.WithArgs(helperArg))
			if err != nil {
				b.Fatal(err)
			}
			_ = p.Close()
		}
	})
}

// benchLink is a bound session on a real plugin and a real ACP client.
func benchLink(b *testing.B) (*link, string, time.Time) {
	p := loadPlugin(b)
	lease := time.Now().Add(time.Hour)
	client := newClient(b, lease)
	l := newLink(b, p, client, "alice")
	tu := tuple("alice", client.Root)
	if _, err := l.conn.OpenSession(context.Background(), host.MethodNew, "s1", bindMeta(b, tu, lease)); err != nil {
		b.Fatal(err)
	}
	return l, tu.SHA256(), lease
}

// BenchmarkRead4KiB: one 4 KiB fs/read_text_file through the plugin
// (host -> plugin -> broker -> host -> ACP -> client) against the same ACP
// call, with the same op tag, made directly on the agent-side connection.
func BenchmarkRead4KiB(b *testing.B) {
	l, digest, lease := benchLink(b)
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(l.client.Root, "4k.txt"), []byte(strings.Repeat("x", 4095)+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Run("direct-acp", func(b *testing.B) {
		req := acp.ReadTextFileRequest{SessionId: "s1", Path: filepath.Join(l.client.Root, "4k.txt"),
			Meta: acpmeta.Op{TupleSHA256: digest, OpKey: "bench:read", Deadline: lease}.Meta()}
		for b.Loop() {
			r, err := l.asc.ReadTextFile(ctx, req)
			if err != nil || len(r.Content) != 4096 {
				b.Fatal(err)
			}
		}
	})
	b.Run("through-plugin", func(b *testing.B) {
		for b.Loop() {
			r, err := l.conn.ReadTextFile(ctx, "s1", nil, "4k.txt", 0, 0)
			if err != nil || len(r.GetContent()) != 4096 {
				b.Fatal(err)
			}
		}
	})
	l.client.Reset()
}

// BenchmarkRunCommand: run_command of /bin/true through the plugin against
// the four ACP calls it stands for (terminal/create, wait_for_exit,
// output, release), with op tags, made directly on the agent-side
// connection.
func BenchmarkRunCommand(b *testing.B) {
	l, digest, lease := benchLink(b)
	ctx := context.Background()
	b.Run("direct-acp", func(b *testing.B) {
		meta := acpmeta.Op{TupleSHA256: digest, OpKey: "bench:run", Deadline: lease}.Meta()
		for b.Loop() {
			t, err := l.asc.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: "s1", Command: "/bin/true", Meta: meta})
			if err != nil {
				b.Fatal(err)
			}
			id := t.TerminalId
			if _, err := l.asc.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: "s1", TerminalId: id, Meta: meta}); err != nil {
				b.Fatal(err)
			}
			if _, err := l.asc.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: "s1", TerminalId: id, Meta: meta}); err != nil {
				b.Fatal(err)
			}
			if _, err := l.asc.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: "s1", TerminalId: id, Meta: meta}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("through-plugin", func(b *testing.B) {
		for b.Loop() {
			r, err := l.conn.RunCommand(ctx, "s1", &pb.RunCommandToolRequest{Command: "/bin/true"})
			if err != nil || r.GetExit().GetExitCode() != 0 {
				b.Fatal(r, err)
			}
		}
	})
	l.client.Reset()
}
