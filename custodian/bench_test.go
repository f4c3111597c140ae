package custodian

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
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
	return d.conn.CallFenced(ctx, op, d.digest, newKey("direct"), 0, time.Now().Add(time.Minute), args, res)
}

func (d *directClient) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	var res wire.ReadResult
	err := d.call(ctx, wire.OpRead, &wire.ReadArgs{Path: strings.TrimPrefix(p.Path, d.root+"/")}, &res)
	return acp.ReadTextFileResponse{Content: res.Content}, err
}

func (d *directClient) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	var res wire.WriteResult
	err := d.call(ctx, wire.OpWrite, &wire.WriteArgs{Path: strings.TrimPrefix(p.Path, d.root+"/"), Content: p.Content}, &res)
	return acp.WriteTextFileResponse{}, err
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
	a, _ := benchAgentRaw(b, rr, custody, false)
	return a
}

// benchAgentRaw is benchAgent; with raw, the custodian's output goes
// through a rawReads first, which the caller can send reads through.
func benchAgentRaw(b *testing.B, rr *realReceiver, custody, raw bool) (*acp.AgentSideConnection, *rawReads) {
	b.Helper()
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	var fromClient io.Reader = c2aR
	var rw *rawReads
	if raw {
		rw = &rawReads{w: a2cW, wait: map[string]chan rawAnswer{}}
		sdkR, sdkW := io.Pipe()
		go rw.filter(c2aR, sdkW)
		fromClient = sdkR
	}
	agent := &testAgent{sessionID: "sess-bench", attachOnNew: true}
	g := &testagent.Gate{R: fromClient, Ready: make(chan struct{})}
	agent.conn = acp.NewAgentSideConnection(agent, a2cW, g)
	close(g.Ready)
	b.Cleanup(func() { c2aW.Close(); a2cW.Close() })
	if !custody {
		conn, err := rr.dialer()(context.Background())
		must(b, err)
		b.Cleanup(func() { conn.Close() })
		acp.NewClientSideConnection(&directClient{conn: conn, digest: rr.tuple.SHA256(), root: rr.tuple.Root}, c2aW, a2cR)
		return agent.conn, rw
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
	return agent.conn, rw
}

// rawReads sends fs/read_text_file and fs/write_text_file as JSON-RPC
// lines of its own beside the SDK's agent side, and takes their answers
// off the custodian's output before the SDK sees it: acp-go-sdk reads no
// message over 10 MiB, while an agent on the TypeScript SDK reads any.
type rawReads struct {
	w    io.Writer // the custodian's input; the SDK too writes one message per Write
	mu   sync.Mutex
	next int
	wait map[string]chan rawAnswer
}

type rawAnswer struct {
	line []byte
	err  error
}

// rawPrefixes begin every answer to a raw call: acp-go-sdk writes
// jsonrpc, then id; the long-line path answers a long write with its keys
// sorted.
var rawPrefixes = [][]byte{[]byte(`{"jsonrpc":"2.0","id":"raw-`), []byte(`{"id":"raw-`)}

// rawID returns the id of the answer line to a raw call, if it is one.
func rawID(line []byte) (string, bool) {
	for _, p := range rawPrefixes {
		if id, ok := bytes.CutPrefix(line, p); ok {
			if n := bytes.IndexByte(id, '"'); n > 0 {
				return "raw-" + string(id[:n]), true
			}
		}
	}
	return "", false
}

// filter copies the custodian's output to the SDK, line by line, except
// the answers to raw reads.
func (r *rawReads) filter(from io.Reader, sdk *io.PipeWriter) {
	br := bufio.NewReaderSize(from, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if id, ok := rawID(line); ok {
			r.deliver(id, rawAnswer{line: line})
		} else if len(line) > 0 {
			if _, werr := sdk.Write(line); werr != nil {
				err = werr
			}
		}
		if err != nil {
			sdk.CloseWithError(err)
			r.failAll(err)
			return
		}
	}
}

func (r *rawReads) deliver(id string, a rawAnswer) {
	r.mu.Lock()
	ch := r.wait[id]
	delete(r.wait, id)
	r.mu.Unlock()
	if ch != nil {
		ch <- a
	}
}

func (r *rawReads) failAll(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, ch := range r.wait {
		ch <- rawAnswer{err: err}
		delete(r.wait, id)
	}
}

// call sends the message msg makes for a fresh id and returns its
// answer's line.
func (r *rawReads) call(ctx context.Context, msg func(id string) ([]byte, error)) ([]byte, error) {
	r.mu.Lock()
	r.next++
	id := fmt.Sprintf("raw-%d", r.next)
	ch := make(chan rawAnswer, 1)
	r.wait[id] = ch
	r.mu.Unlock()
	b, err := msg(id)
	if err != nil {
		return nil, err
	}
	if _, err := r.w.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	select {
	case a := <-ch:
		return a.line, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// quotedContent is a file's content encoded once as a JSON string, as
// json.Marshal encodes it, so that the benchmark's agent side costs a copy
// per transfer, not an encode or a decode: the agent's own codec is not
// what the benchmark measures (run K, docs/performance.md).
type quotedContent struct {
	plain  string
	quoted []byte
}

func newQuotedContent(b *testing.B, content string) *quotedContent {
	q, err := json.Marshal(content)
	must(b, err)
	return &quotedContent{plain: content, quoted: q}
}

// write sends one fs/write_text_file of c, its params but the content
// encoded by encoding/json, and checks that it answered a result.
func (r *rawReads) write(ctx context.Context, p acp.WriteTextFileRequest, c *quotedContent) error {
	line, err := r.call(ctx, func(id string) ([]byte, error) {
		head, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": acp.ClientMethodFsWriteTextFile,
			"params": map[string]any{"sessionId": p.SessionId, "path": p.Path, "_meta": p.Meta}})
		if err != nil {
			return nil, err
		}
		msg := make([]byte, 0, len(head)+len(c.quoted)+16)
		msg = append(msg, head[:len(head)-2]...) // cut "}}"
		msg = append(msg, `,"content":`...)
		msg = append(msg, c.quoted...)
		return append(msg, "}}"...), nil
	})
	if err != nil {
		return err
	}
	var resp struct {
		Result *acp.WriteTextFileResponse `json:"result"`
		Error  *acp.RequestError          `json:"error"`
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return err
	}
	if resp.Error != nil || resp.Result == nil {
		return fmt.Errorf("write answered %v", resp.Error)
	}
	return nil
}

// readIs sends one fs/read_text_file and reports whether it answered c.
// An answer whose result ends with c encoded as c.quoted is checked by
// comparing those bytes and decoding the rest with the content cut to "";
// any other is decoded whole and compared.
func (r *rawReads) readIs(ctx context.Context, p acp.ReadTextFileRequest, c *quotedContent) (bool, error) {
	line, err := r.call(ctx, func(id string) ([]byte, error) {
		return json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": acp.ClientMethodFsReadTextFile, "params": p})
	})
	if err != nil {
		return false, err
	}
	var resp struct {
		Result *acp.ReadTextFileResponse `json:"result"`
		Error  *acp.RequestError         `json:"error"`
	}
	tail := len(c.quoted) + len("}}\n")
	if cut := len(line) - tail; cut > 0 && bytes.HasSuffix(line[:cut], []byte(`"content":`)) &&
		bytes.Equal(line[cut:len(line)-3], c.quoted) && string(line[len(line)-3:]) == "}}\n" {
		env := append(bytes.Clone(line[:cut]), `""}}`...)
		if err := json.Unmarshal(env, &resp); err == nil && resp.Error == nil && resp.Result != nil && resp.Result.Content == "" {
			return true, nil
		}
		resp.Result, resp.Error = nil, nil
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return false, err
	}
	if resp.Error != nil || resp.Result == nil {
		return false, fmt.Errorf("read answered %v", resp.Error)
	}
	return resp.Result.Content == c.plain, nil
}

func benchMeta(rr *realReceiver, key string) map[string]any {
	return acpmeta.Op{TupleSHA256: rr.tuple.SHA256(), OpKey: key, Deadline: time.Now().Add(time.Minute)}.Meta()
}

// interleaved runs one call with custody disabled and one with custody
// per iteration, alternating which goes first, so load on the shared
// machine hits both alike. It reports each one's p50 and p99 (nearest
// rank), their ratio and the custodian's added p50; ns/op is the pair.
func interleaved(b *testing.B, rr *realReceiver, call func(a *acp.AgentSideConnection, key string)) {
	b.Helper()
	agents := [2]*acp.AgentSideConnection{benchAgent(b, rr, false), benchAgent(b, rr, true)}
	run := newKey("b") // op keys stay unique across -count runs on one receiver
	var took [2][]time.Duration
	for i := 0; b.Loop(); i++ {
		for j := range 2 {
			which := (i + j) % 2
			start := time.Now()
			call(agents[which], fmt.Sprintf("%s-%d-%d", run, i, which))
			took[which] = append(took[which], time.Since(start))
		}
	}
	direct, custody := quantile(took[0], 0.5), quantile(took[1], 0.5)
	b.ReportMetric(float64(direct.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(custody.Microseconds()), "custody-p50-µs")
	b.ReportMetric(float64(quantile(took[0], 0.99).Microseconds()), "direct-p99-µs")
	b.ReportMetric(float64(quantile(took[1], 0.99).Microseconds()), "custody-p99-µs")
	b.ReportMetric(float64(custody)/float64(direct), "custody/direct-p50")
	b.ReportMetric(float64((custody - direct).Microseconds()), "added-p50-µs")
}

// quantile returns the q-quantile (nearest rank) of ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// BenchmarkIntegrationRead4KiB: fs/read_text_file of a 4 KiB file through
// a real receiver process, with custody and with custody disabled,
// interleaved (custody/direct is the custodian's added cost: no durable
// write, audit off the path).
func BenchmarkIntegrationRead4KiB(b *testing.B) {
	rr := startReceiver(b)
	path := rr.file("4k.txt")
	must(b, os.WriteFile(path, []byte(strings.Repeat("0123456789abcde\n", 256)), 0o644))
	ctx := context.Background()
	interleaved(b, rr, func(a *acp.AgentSideConnection, key string) {
		r, err := a.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: "sess-bench", Path: path, Meta: benchMeta(rr, key)})
		if err != nil || len(r.Content) != 4096 {
			b.Fatalf("read: %d bytes, %v", len(r.Content), err)
		}
	})
}

// BenchmarkIntegrationWrite64KiB: fs/write_text_file of 64 KiB, keyed
// (one durable write before dispatch), against the same write with
// custody disabled, interleaved.
func BenchmarkIntegrationWrite64KiB(b *testing.B) {
	rr := startReceiver(b)
	content := strings.Repeat("0123456789abcde\n", 4096)
	ctx := context.Background()
	interleaved(b, rr, func(a *acp.AgentSideConnection, key string) {
		if _, err := a.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: "sess-bench", Path: rr.file("64k.txt"),
			Content: content, Meta: benchMeta(rr, key)}); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkIntegrationExec: what tether-plugin's run_command sends for
// /bin/true (terminal/create, wait_for_exit, output, release) through a
// real receiver process, with custody and with custody disabled,
// interleaved.
func BenchmarkIntegrationExec(b *testing.B) {
	rr := startReceiver(b)
	ctx := context.Background()
	interleaved(b, rr, func(a *acp.AgentSideConnection, key string) {
		for _, call := range execCalls(ctx, a, rr, key) {
			if err := call(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkIntegrationExecCalls splits BenchmarkIntegrationExec by call:
// the p50 of each of the four calls with custody and with custody
// disabled, interleaved, and what custody adds to each (where an exec's
// custody cost goes).
func BenchmarkIntegrationExecCalls(b *testing.B) {
	rr := startReceiver(b)
	agents := [2]*acp.AgentSideConnection{benchAgent(b, rr, false), benchAgent(b, rr, true)}
	ctx := context.Background()
	run := newKey("c")
	names := [4]string{"create", "wait", "output", "release"}
	var took [2][4][]time.Duration
	for i := 0; b.Loop(); i++ {
		for j := range 2 {
			w := (i + j) % 2
			key := fmt.Sprintf("%s-%d-%d", run, i, w)
			calls := execCalls(ctx, agents[w], rr, key)
			for k, call := range calls {
				start := time.Now()
				if err := call(); err != nil {
					b.Fatalf("%s: %v", names[k], err)
				}
				took[w][k] = append(took[w][k], time.Since(start))
			}
		}
	}
	for k, n := range names {
		d, c := quantile(took[0][k], 0.5), quantile(took[1][k], 0.5)
		b.ReportMetric(float64((c - d).Microseconds()), n+"-added-p50-µs")
	}
}

// execCalls returns run_command's four calls for one command, in order.
func execCalls(ctx context.Context, a *acp.AgentSideConnection, rr *realReceiver, key string) [4]func() error {
	var id string
	sid := acp.SessionId("sess-bench")
	return [4]func() error{
		func() error {
			t, err := a.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid, Command: "/bin/true",
				Cwd: &rr.tuple.Root, Meta: benchMeta(rr, key+":create")})
			id = t.TerminalId
			return err
		},
		func() error {
			_, err := a.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid, TerminalId: id, Meta: benchMeta(rr, key+":wait")})
			return err
		},
		func() error {
			_, err := a.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: sid, TerminalId: id, Meta: benchMeta(rr, key+":output")})
			return err
		},
		func() error {
			_, err := a.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid, TerminalId: id, Meta: benchMeta(rr, key+":release")})
			return err
		},
	}
}

// BenchmarkIntegrationFileSize writes and reads files through the
// custodian and a real receiver (chunked: one frame a chunk), interleaved
// round by round with cp of the same file on the same disk, and reports
// each one's throughput and the ratio to cp's (goal: at least 0.5x at
// 16 MiB). With TETHER_BENCH_FULL=1 (make bench) the sizes are 1, 16 and
// 64 MiB; otherwise 1 and 2 MiB, so that make test runs it cheaply. Reads
// go as raw JSON-RPC lines beside the SDK's agent side (rawReads), since
// acp-go-sdk reads no message over 10 MiB. The custodian runs in a
// process of its own (benchAgentProc): its VmRSS is sampled every
// millisecond during each write and each read, against its VmRSS once
// bound and before any transfer (issue 33's goal: at most twice that
// plus 16 MiB), and its CPU is read apart from the agent side's.
func BenchmarkIntegrationFileSize(b *testing.B) {
	rr := startReceiver(b)
	_, raw, pid := benchAgentProc(b, rr)
	idle, err := pidStatus(pid, "VmRSS") // bound, before any transfer
	must(b, err)
	sizes := []int{1 << 20, 2 << 20}
	if os.Getenv("TETHER_BENCH_FULL") == "1" {
		sizes = []int{1 << 20, 16 << 20, 64 << 20}
	}
	run := newKey("fs")
	for _, n := range sizes {
		b.Run(fmt.Sprintf("%dMiB", n>>20), func(b *testing.B) {
			content := strings.Repeat("0123456789abcdefghijklmnopqrstuvwxyz ok\n", n/40+1)[:n]
			src := filepath.Join(b.TempDir(), "src")
			must(b, os.WriteFile(src, []byte(content), 0o644))
			qc := newQuotedContent(b, content)
			path := filepath.Join(rr.tuple.Root, "size.txt")
			var cp, wr, rd []time.Duration
			var cpu [2][3]time.Duration // [write, read][agent side, custodian, receiver]
			var peak [2]int64           // [write, read]: the custodian process's VmRSS at its highest
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				must(b, exec.Command("cp", src, filepath.Join(rr.tuple.Root, "cp.txt")).Run())
				cp = append(cp, time.Since(start))
				stop := samplePidRSS(pid, &peak[0])
				start, c0 := time.Now(), cpuOf(rr, pid)
				must(b, raw.write(context.Background(), acp.WriteTextFileRequest{SessionId: "sess-bench", Path: path,
					Meta: benchMeta(rr, fmt.Sprintf("%s-%d-%d", run, n, i))}, qc))
				wr = append(wr, time.Since(start))
				stop()
				stop = samplePidRSS(pid, &peak[1])
				start, c1 := time.Now(), cpuOf(rr, pid)
				same, err := raw.readIs(context.Background(), acp.ReadTextFileRequest{SessionId: "sess-bench", Path: path,
					Meta: benchMeta(rr, newKey("r"))}, qc)
				must(b, err)
				rd = append(rd, time.Since(start))
				stop()
				c2 := cpuOf(rr, pid)
				for k := range 3 {
					cpu[0][k] += c1[k] - c0[k]
					cpu[1][k] += c2[k] - c1[k]
				}
				if !same {
					b.Fatalf("read of %d bytes: not what was written", n)
				}
			}
			mib := float64(n) / (1 << 20) * float64(len(wr))
			for i, what := range []string{"write", "read"} {
				b.ReportMetric(float64(cpu[i][0].Milliseconds())/mib, what+"-agent-cpu-ms/MiB")
				b.ReportMetric(float64(cpu[i][1].Milliseconds())/mib, what+"-custodian-cpu-ms/MiB")
				b.ReportMetric(float64(cpu[i][2].Milliseconds())/mib, what+"-receiver-cpu-ms/MiB")
			}
			b.ReportMetric(float64(idle)/(1<<20), "custodian-rss-idle-MiB")
			b.ReportMetric(float64(peak[0])/(1<<20), "custodian-write-rss-peak-MiB")
			b.ReportMetric(float64(peak[1])/(1<<20), "custodian-read-rss-peak-MiB")
			b.ReportMetric(float64(max(peak[0], peak[1]))/float64(2*idle+16<<20), "custodian-rss-peak/goal")
			mibs := func(d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }
			c := quantile(cp, 0.5)
			b.ReportMetric(mibs(c), "cp-MiB/s")
			b.ReportMetric(mibs(quantile(wr, 0.5)), "write-MiB/s")
			b.ReportMetric(mibs(quantile(wr, 0.5))/mibs(c), "write/cp")
			b.ReportMetric(mibs(quantile(rd, 0.5)), "read-MiB/s")
			b.ReportMetric(mibs(quantile(rd, 0.5))/mibs(c), "read/cp")
		})
	}
}

// cpuOf returns the CPU time used so far by this process (the agent
// side), by the custodian process pid and by the receiver process.
func cpuOf(rr *realReceiver, pid int) [3]time.Duration {
	c := cpuNow(rr)
	return [3]time.Duration{c[0], pidCPU(pid), c[1]}
}

// cpuNow returns the CPU time used so far by this process (the agent side
// and the custodian) and by the receiver process.
func cpuNow(rr *realReceiver) [2]time.Duration {
	var out [2]time.Duration
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out[0] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", rr.PID())); err == nil {
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 12 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			out[1] = time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ
		}
	}
	return out
}
