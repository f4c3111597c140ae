package host_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/plugin/host"
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

// measure runs b.N rounds of the variants, one call each per round in
// rotating order, so machine noise hits them alike, and reports each
// one's p50 and p99 (µs) and the ratio of each p50 to the first's.
func measure(b *testing.B, names []string, calls ...func() error) {
	for _, call := range calls { // warm every path once
		if err := call(); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([][]time.Duration, len(calls))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range calls {
			k := (i + j) % len(calls)
			start := time.Now()
			if err := calls[k](); err != nil {
				b.Fatalf("%s: %v", names[k], err)
			}
			lat[k] = append(lat[k], time.Since(start))
		}
	}
	b.StopTimer()
	base := pct(lat[0], 50)
	for k, name := range names {
		p50, p99 := pct(lat[k], 50), pct(lat[k], 99)
		b.ReportMetric(float64(p50)/1e3, name+"-p50-µs")
		b.ReportMetric(float64(p99)/1e3, name+"-p99-µs")
		if k > 0 {
			b.ReportMetric(float64(p50)/float64(base), name+"/"+names[0]+"-p50")
			b.ReportMetric(float64(p50-base)/1e3, "hop-p50-µs")
		}
	}
}

// pct returns the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max((len(s)*p+99)/100-1, 0)]
}

// BenchmarkRead4KiB: one 4 KiB fs/read_text_file through the plugin
// (host -> plugin for the plan, then host -> ACP -> client) against the same ACP
// call, with the same op tag, made directly on the agent-side connection;
// interleaved. hop-p50-µs is what the plugin hop adds.
func BenchmarkRead4KiB(b *testing.B) {
	l, digest, lease := benchLink(b)
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(l.client.Root, "4k.txt"), []byte(strings.Repeat("x", 4095)+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	req := acp.ReadTextFileRequest{SessionId: "s1", Path: filepath.Join(l.client.Root, "4k.txt"),
		Meta: acpmeta.Op{TupleSHA256: digest, OpKey: "bench:read", Deadline: lease}.Meta()}
	measure(b, []string{"direct-acp", "through-plugin"}, func() error {
		r, err := l.asc.ReadTextFile(ctx, req)
		return check(len(r.Content) == 4096, err)
	}, func() error {
		r, err := l.conn.ReadTextFile(ctx, "s1", host.CallOptions{}, "4k.txt", 0, 0)
		return check(len(r.Content) == 4096, err)
	})
	l.client.Reset()
}

// BenchmarkRunCommand: run_command of /bin/true through the plugin against
// the four ACP calls it stands for (terminal/create, wait_for_exit,
// output, release), with op tags, made directly on the agent-side
// connection; interleaved.
func BenchmarkRunCommand(b *testing.B) {
	l, digest, lease := benchLink(b)
	ctx := context.Background()
	meta := acpmeta.Op{TupleSHA256: digest, OpKey: "bench:run", Deadline: lease}.Meta()
	direct := func() error {
		t, err := l.asc.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: "s1", Command: "/bin/true", Meta: meta})
		if err != nil {
			return err
		}
		id := t.TerminalId
		if _, err := l.asc.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: "s1", TerminalId: id, Meta: meta}); err != nil {
			return err
		}
		if _, err := l.asc.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: "s1", TerminalId: id, Meta: meta}); err != nil {
			return err
		}
		_, err = l.asc.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: "s1", TerminalId: id, Meta: meta})
		return err
	}
	measure(b, []string{"direct-acp", "through-plugin"}, direct, func() error {
		r, err := l.conn.RunCommand(ctx, "s1", host.CallOptions{}, host.Command{Command: "/bin/true"})
		return check(exitCode(r) == 0, err)
	})
	l.client.Reset()
}

func check(ok bool, err error) error {
	if err == nil && !ok {
		err = errors.New("unexpected result")
	}
	return err
}
