package custodian

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/internal/testagent"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// The file-size benchmark runs the custodian in a process of its own, as
// it is deployed (this test binary re-run as benchProcCustodian), so that its
// resident set and CPU are read from /proc/<pid> apart from the agent
// side's, whose copies of the content stay in the benchmark's process.

const benchCustodianEnv = "TETHER_CUSTODIAN_BENCH_PROCESS"

// benchProcConfig is what the benchmark hands the custodian process.
type benchProcConfig struct {
	State    string          `json:"state"`
	Key      string          `json:"key"`
	Sock     string          `json:"sock"` // the real receiver's unix socket
	Tuple    admission.Tuple `json:"tuple"`
	NotAfter time.Time       `json:"not_after"`
	// CPUProfile, if set, is where the process writes its CPU profile
	// (TETHER_BENCH_CUSTODIAN_CPUPROFILE in the benchmark's environment).
	CPUProfile string `json:"cpu_profile,omitempty"`
}

// benchProcCustodian is the custodian process: it serves ACP on stdin and
// stdout, binds one session (the agent in the benchmark's process
// attaches), closes fd 3 to say it is bound, and serves until its stdin
// ends.
func benchProcCustodian() int {
	var pc benchProcConfig
	if err := json.Unmarshal([]byte(os.Getenv(benchCustodianEnv+"_CONFIG")), &pc); err != nil {
		return benchProcFail(err)
	}
	c, err := New(Options{StateDir: pc.State, AuditKey: []byte(pc.Key)})
	if err != nil {
		return benchProcFail(err)
	}
	recv := NewReceiver(StreamDialer(transport.Unix{Path: pc.Sock, HostOnly: true}.Dial, wireclient.ClientConfig{}), Backoff{}, nil)
	conn := c.Serve(os.Stdout, os.Stdin, ConnOptions{})
	ctx := context.Background()
	if _, err := conn.Initialize(ctx); err != nil {
		return benchProcFail(err)
	}
	if _, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: pc.Tuple.Root, McpServers: []acp.McpServer{}},
		Binding{Tuple: pc.Tuple, LeaseNotAfter: pc.NotAfter, Principal: "alice", Receiver: recv}); err != nil {
		return benchProcFail(err)
	}
	if pc.CPUProfile != "" {
		f, err := os.Create(pc.CPUProfile)
		if err != nil {
			return benchProcFail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return benchProcFail(err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	os.NewFile(3, "bound").Close()
	<-conn.Done()
	conn.Close()
	recv.Close()
	if err := c.Close(); err != nil {
		return benchProcFail(err)
	}
	return 0
}

func benchProcFail(err error) int {
	fmt.Fprintln(os.Stderr, "bench custodian:", err)
	return 1
}

// benchAgentProc starts the custodian process against rr and returns the
// agent side's connection to it, the raw reads beside it and the
// process's pid. The benchmark's cleanup ends the process (its stdin
// closed, then waited for).
func benchAgentProc(b *testing.B, rr *realReceiver) (*acp.AgentSideConnection, *rawReads, int) {
	b.Helper()
	skey, _, err := audit.GenerateKey("tether.bench/custodian")
	must(b, err)
	pc := benchProcConfig{State: filepath.Join(b.TempDir(), "state"), Key: skey, Sock: rr.sock, Tuple: rr.tuple,
		NotAfter: time.Now().Add(time.Hour), CPUProfile: os.Getenv("TETHER_BENCH_CUSTODIAN_CPUPROFILE")}
	cfg, err := json.Marshal(pc)
	must(b, err)
	bin := os.Args[0]
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), benchCustodianEnv+"=1", benchCustodianEnv+"_CONFIG="+string(cfg))
	cmd.Stderr = os.Stderr
	boundR, boundW, err := os.Pipe()
	must(b, err)
	cmd.ExtraFiles = []*os.File{boundW}
	toC, err := cmd.StdinPipe()
	must(b, err)
	fromC, err := cmd.StdoutPipe()
	must(b, err)
	must(b, cmd.Start())
	boundW.Close()
	b.Cleanup(func() {
		toC.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("custodian process: %v", err)
		}
	})
	rw := &rawReads{w: toC, wait: map[string]chan rawAnswer{}}
	sdkR, sdkW := io.Pipe()
	go rw.filter(fromC, sdkW)
	agent := &testAgent{sessionID: "sess-bench", attachOnNew: true}
	g := &testagent.Gate{R: sdkR, Ready: make(chan struct{})}
	agent.conn = acp.NewAgentSideConnection(agent, toC, g)
	close(g.Ready)
	if _, err := io.Copy(io.Discard, boundR); err != nil { // fd 3 closes once the session is bound
		b.Fatal(err)
	}
	boundR.Close()
	if agent.attachErr != nil {
		b.Fatal(agent.attachErr)
	}
	return agent.conn, rw, cmd.Process.Pid
}

// pidStatus returns one field of /proc/<pid>/status (VmRSS, VmHWM), in
// bytes.
func pidStatus(pid int, field string) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// pidCPU returns the CPU time process pid used so far (utime + stime of
// /proc/<pid>/stat, in 10 ms ticks).
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) <= 12 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ
}

// samplePidRSS raises *peak to pid's VmRSS, sampled every millisecond
// until the returned stop is called (which waits for the sampler).
func samplePidRSS(pid int, peak *int64) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			if v, err := pidStatus(pid, "VmRSS"); err == nil && v > *peak {
				*peak = v
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-ended }
}
